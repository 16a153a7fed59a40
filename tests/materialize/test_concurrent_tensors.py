"""threads= replays independent tensors side by side: eager's bits, the serial path's outcome.

``materialize.concurrent`` runs small tensors on worker threads and large
(split) ones alone; the chunk floor is lowered here so that "large" is cheap.
"""

from __future__ import annotations

import contextvars
import multiprocessing as mp
import sys
import threading
import time

import numpy as np
import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module
from torchdefer.materialize import _parallel as parallel
from torchdefer.materialize import concurrent


@torchdefer.composite
def _clipped_normal_(t: torch.Tensor, limit: float = 1.0) -> torch.Tensor:
    """Draws as many numbers as the values it reads ask for (the README's example)."""
    t.normal_()
    while bool((t.abs() > limit).any()):
        t.copy_(torch.where(t.abs() > limit, torch.randn_like(t), t))
    return t


class _Mixed(nn.Module):
    """Many small tensors, a few large, ties, buffers, shared storage, a dead random op,
    a data-dependent composite, an external tensor, and a tensor computed from another."""

    def __init__(self, external: torch.Tensor) -> None:
        super().__init__()
        self.small = nn.ModuleList(nn.Linear(17, 9) for _ in range(12))
        self.big = nn.Linear(300, 200)  # 60k elements: split with the floor lowered
        self.embed = nn.Embedding(211, 300)
        self.head = nn.Linear(300, 211, bias=False)
        self.head.weight = self.embed.weight  # tied: one object
        self.dead = nn.Parameter(torch.randn(50, 40))
        with torch.no_grad():
            self.dead.copy_(torch.ones(50, 40))  # overwrites every element: randn dead
        self.clipped = nn.Parameter(_clipped_normal_(torch.empty(33, 7)))
        self.after_clip = nn.Parameter(torch.randn(19))  # positioned after an anchor
        self.register_buffer("mean", torch.zeros(64).uniform_())
        self.register_buffer("scaled", self.mean * 3)  # computed from another
        self.flat = nn.Parameter(torch.randn(64))
        self.row = self.flat.detach()[8:24]  # a plain attribute sharing flat's storage
        self.register_buffer("ext", external + 1)
        self.norm = nn.LayerNorm(9)


def _build_both(seed: int = 0):
    external = torch.arange(5.0)
    torch.manual_seed(seed)
    eager = _Mixed(external)
    after = torch.get_rng_state()
    torch.manual_seed(seed)
    deferred = torchdefer.deferred_init(_Mixed, external)
    return eager, deferred, after, external


@pytest.fixture(autouse=True)
def on():
    """Side by side with the default budget, also where a caller set another."""
    with concurrent.side_by_side():
        yield


@pytest.fixture
def worker_threads(monkeypatch):
    """The names of the threads runs of jobs ran on."""
    seen: set[str] = set()
    real = concurrent._Flight._run_in_order

    def spying(self, part, futures):
        seen.add(threading.current_thread().name)
        return real(self, part, futures)

    monkeypatch.setattr(concurrent._Flight, "_run_in_order", spying)
    return seen


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_module_with_tensors_side_by_side_is_eager(threads, worker_threads):
    eager, deferred, after, _ = _build_both()
    with parallel.min_chunk(4096):
        torchdefer.materialize_module(deferred, threads=threads)
    assert_same_module(deferred, eager)
    assert deferred.head.weight is deferred.embed.weight
    assert deferred.row.untyped_storage().data_ptr() == deferred.flat.untyped_storage().data_ptr()
    assert torch.equal(deferred.row, eager.row)
    assert torch.equal(torch.get_rng_state(), after)
    assert bool(worker_threads) == (threads > 1)
    assert all(name.startswith("torchdefer-replay") for name in worker_threads)


@pytest.mark.parametrize("threads", [2, 4])
def test_tensors_side_by_side_in_float16_and_bfloat16(threads):
    """dtype= converts on the workers; the bits are eager's .to(dtype)."""
    eager, deferred, _, _ = _build_both(seed=3)
    torchdefer.materialize_module(deferred, dtype=torch.bfloat16, threads=threads)
    eager.to(torch.bfloat16)
    assert_same_module(deferred, eager)


def _float64_arange() -> torch.Tensor:
    return torch.arange(96) * 0.5  # takes the default dtype


class _TwoDtypes(nn.Module):
    """Parts built under another default dtype: their replay switches a process-wide
    setting, so it must run alone."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.ModuleList(nn.Linear(16, 16) for _ in range(6))
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            self.register_buffer("steps", _float64_arange())
            self.b = nn.Linear(12, 12)
        finally:
            torch.set_default_dtype(before)
        self.c = nn.ModuleList(nn.Linear(16, 16) for _ in range(6))
        self.register_buffer("steps32", _float64_arange())


@pytest.mark.parametrize("threads", [2, 4])
def test_a_tensor_needing_other_process_settings_runs_alone(threads, monkeypatch):
    alone = []
    real_check = concurrent.check_ambient

    def check(ambient):
        try:
            real_check(ambient)
        except concurrent.NeedsAlone:
            alone.append(ambient)
            raise

    monkeypatch.setattr(concurrent, "check_ambient", check)
    torch.manual_seed(1)
    eager = _TwoDtypes()
    torch.manual_seed(1)
    deferred = torchdefer.deferred_init(_TwoDtypes)
    torchdefer.materialize_module(deferred, threads=threads)
    assert_same_module(deferred, eager)
    assert deferred.steps.dtype == torch.float64 and deferred.steps32.dtype == torch.float32
    assert torch.get_default_dtype() == torch.float32
    assert alone  # at least one replay found it needed the process to itself


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_a_failure_leaves_the_module_as_the_serial_path(threads):
    """The external tensor changed after recording: its buffer's replay refuses. The
    tensors before it are real, it and those after stay deferred, whatever threads."""
    eager, deferred, _, external = _build_both()
    external.add_(1)
    with pytest.raises(torchdefer.errors.ExternalTensorModifiedError, match="after it was recorded"):
        torchdefer.materialize_module(deferred, threads=threads)
    order = [name for name, _ in torchdefer.materialize._api.deferred_reached(deferred)[0].items()]
    deferred_now = {name for name, t in _reached(deferred).items() if torchdefer.is_fake(t)}
    failed = order.index("ext")
    assert deferred_now == set(order[failed:])
    for name in order[:failed]:
        assert torch.equal(_reached_eager(eager)[name], _reached(deferred)[name]), name


def _reached(module):
    out = dict(module.named_parameters())
    out.update(module.named_buffers())
    out["row"] = module.row
    return out


def _reached_eager(module):
    return _reached(module)


def test_scheduler_keeps_order_budget_and_storage_rule():
    """At most the budget in flight (the first always starts), jobs over one storage
    one after the other, alone jobs with nothing else running, results in order."""
    lock = threading.Lock()
    running: dict[int, int] = {}
    seen: list[tuple[int, ...]] = []
    release = threading.Event()

    def job(i, nbytes, storage=None, alone=False):
        return concurrent.Job(index=i, nbytes=nbytes, storage=(0, storage or 1000 + i),
                              alone=alone)

    jobs = [job(0, 10), job(1, 10), job(2, 10, storage=7), job(3, 10, storage=7),
            job(4, 40), job(5, 10, alone=True), job(6, 25), job(7, 5), job(8, 5, storage=8),
            job(9, 5, storage=8), job(10, 5)]

    ran_on: dict[int, str] = {}

    def run(j):
        with lock:
            running[j.index] = j.nbytes
            seen.append(tuple(sorted(running)))
            ran_on[j.index] = threading.current_thread().name
        release.wait(0.01)  # let others start meanwhile, if they may
        with lock:
            del running[j.index]
        return torch.tensor(j.index)

    with concurrent.budget(30):
        out = [(j.index, int(t)) for j, t in concurrent.replayed_in_order(jobs, run, 4)]
    assert out == [(i, i) for i in range(11)]
    for state in seen:
        total = sum(j.nbytes for j in jobs if j.index in state)
        assert total <= 30 or len(state) == 1, state
        assert not ({2, 3} <= set(state)) and not ({8, 9} <= set(state)), state
        assert 5 not in state or state == (5,), state
    assert ran_on[5] == threading.current_thread().name  # alone: on the caller
    assert ran_on[0].startswith("torchdefer-replay") and ran_on[0] != ran_on[1]


def test_a_window_is_cut_into_runs_of_consecutive_jobs_of_about_equal_bytes():
    jobs = [concurrent.Job(index=i, nbytes=n, storage=(0, i), alone=False)
            for i, n in enumerate([5, 1, 1, 1, 1, 1, 4, 2, 2, 2])]
    for threads in (2, 3, 4):
        runs = concurrent._runs(jobs, threads)
        assert [j for run in runs for j in run] == jobs
        assert 2 <= len(runs) <= threads
    assert [[j.index for j in run] for run in concurrent._runs(jobs, 2)] == [
        [0, 1, 2, 3, 4, 5], [6, 7, 8, 9]]


def test_scheduler_raises_the_first_failure_in_order_and_stops_the_others():
    """Job 200 (a later run) fails first in time, job 3 later: job 3's error is raised
    (the serial path's), after 0-2 were handed back; the runs stop, and no job still
    runs when the error reaches the caller."""
    started: list[int] = []
    running = [0]
    lock = threading.Lock()
    three_may_fail = threading.Event()

    def run(j):
        with lock:
            started.append(j.index)
            running[0] += 1
        try:
            if j.index == 200:
                three_may_fail.set()
                raise ValueError("job 200")
            if j.index == 3:
                three_may_fail.wait(5)
                raise ValueError("job 3")
            time.sleep(0.002)  # others may start meanwhile
            return torch.tensor(j.index)
        finally:
            with lock:
                running[0] -= 1

    jobs = [concurrent.Job(index=i, nbytes=1, storage=(0, i), alone=False) for i in range(400)]
    got = []
    with concurrent.budget(1000), pytest.raises(ValueError, match="job 3"):
        for _, t in concurrent.replayed_in_order(jobs, run, 3):
            got.append(int(t))
    assert running[0] == 0
    assert got == [0, 1, 2]
    assert 200 in started and 4 not in started and 201 not in started
    assert len(started) < 400  # the last run stopped too


@pytest.fixture
def switching_often():
    """Threads switch every microsecond: races in Python code show up."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_user_threads_materializing_one_graph_at_once_get_eager_bits(switching_often):
    """The cache and the RNG states are shared by threads: hammer them."""
    torch.manual_seed(0)
    eager = [torch.randn(300 + i) for i in range(64)]
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(lambda: [torch.randn(300 + i) for i in range(64)])
    views = [t[1:5] for t in deferred[::4]]  # views: rebuilt over their base's storage
    results: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for i in list(range(64))[k::4][::-1 if k % 2 else 1]:
                results[i] = torchdefer.materialize_tensor(deferred[i], threads=1)
        except BaseException as e:  # reported below, on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(64):
        assert torch.equal(results[i], eager[i]), i
    for k, view in enumerate(views):
        real = torchdefer.materialize_tensor(view)
        assert torch.equal(real, eager[4 * k][1:5])
        assert real.untyped_storage().data_ptr() == results[4 * k].untyped_storage().data_ptr()


def test_rng_states_answer_the_same_from_many_threads(switching_often):
    """state_at from 4 threads at once, positions in shuffled orders: the serial answers.

    Recorded on (fake) CUDA and asked for the CPU model: the CPU layout of the
    stream is computed by whichever thread asks first, while the others ask too.
    """
    def build():
        return [torch.empty(n, device="cuda").normal_() for n in (1000, 3, 777, 5000, 64, 1)] + [
            torch.rand(n, device="cuda") for n in (999, 2, 4096)]

    rng = np.random.default_rng(0)

    def states_of(order, threads):
        torch.manual_seed(2)
        tensors = torchdefer.deferred_init(build)
        nodes = [t._value.node for t in tensors]
        states = nodes[0].graph.rng.states
        out: dict[int, torch.Tensor] = {}

        def ask(part):
            for i in part:
                out[i] = states.start_of(nodes[i], "cpu")

        parts = [order[k::threads] for k in range(threads)]
        ts = [threading.Thread(target=ask, args=(p,)) for p in parts]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out

    serial = states_of(list(range(9)), 1)
    for _ in range(5):
        order = [int(i) for i in rng.permutation(9)]
        got = states_of(order, 4)
        for i in range(9):
            assert torch.equal(got[i], serial[i]), i


def _materialize_in_child(queue) -> None:
    # torch's OpenMP pool does not survive a fork once the parent's main thread
    # used it (any large op, earlier tests included): this is the way around it.
    torch.set_num_threads(1)
    eager, deferred, _, _ = _build_both(seed=5)
    with parallel.min_chunk(4096):
        torchdefer.materialize_module(deferred, threads=3)
    queue.put(all(torch.equal(a, b) for a, b in
                  zip(deferred.state_dict().values(), eager.state_dict().values())))


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs os.fork")
def test_a_forked_child_materializes_again_after_a_threaded_materialization():
    """No replay thread outlives its call, and the kept draw threads are forgotten in
    a fork: the child starts its own. (torch's OpenMP pool is another matter: a child
    whose parent ran a large op on its main thread hangs in its own first one, with
    or without torchdefer; torch.set_num_threads(1) in the child avoids it.)"""
    torch.randn(1 << 20).sum()  # the parent's main thread has used the OpenMP pool
    _, deferred, _, _ = _build_both(seed=5)
    with parallel.min_chunk(4096):
        torchdefer.materialize_module(deferred, threads=3)
    assert not [t for t in threading.enumerate() if t.name.startswith("torchdefer-replay")]
    context = mp.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_materialize_in_child, args=(queue,))
    child.start()
    child.join(120)  # hang detection, not a timing
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive, "the forked child hung"
    assert child.exitcode == 0 and queue.get(timeout=10)


class _Medium(nn.Module):
    """Tensors below the split size, on two streams, large enough that a run reaches
    its first start by a GF(2) jump (more than 4M words past the last known state)."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.w = nn.ParameterList(
            nn.Parameter(torch.empty(1000, 1500).normal_(0, 0.02)) for _ in range(8))
        self.u = nn.ParameterList(
            nn.Parameter(torch.empty(1500, 999).uniform_(generator=generator)) for _ in range(4))
        self.r = nn.Parameter(torch.randn(1200, 1201, dtype=torch.float64))
        self.b = nn.Parameter(torch.zeros(1500))


@pytest.mark.parametrize("threads", [2, 3])
def test_runs_reaching_their_start_by_a_jump_are_eager(threads, worker_threads, monkeypatch):
    from torchdefer.rng import mt19937

    jumps = []
    real_advance = mt19937.advance

    def counting(state, words, **kwargs):
        jumps.append(words >= mt19937._DRAW_LIMIT)
        return real_advance(state, words, **kwargs)

    def build():
        g = torch.Generator().manual_seed(9)
        torch.manual_seed(8)
        return _Medium(g)

    eager = build()
    after = torch.get_rng_state()
    deferred = torchdefer.deferred_init(build)
    # Recorded while other threads live (the kept draw threads of an earlier
    # test), the recording remembered every op's exact state: forget them, so
    # that the runs reach their starts as after a recording made alone.
    next(iter(deferred.parameters()))._value.node.graph.rng.states._known.clear()
    monkeypatch.setattr(mt19937, "advance", counting)
    with concurrent.budget(40 << 20):  # windows of ~6 tensors: runs of 2-3
        torchdefer.materialize_module(deferred, threads=threads)
    assert any(jumps)
    assert_same_module(deferred, eager)
    assert torch.equal(torch.get_rng_state(), after)
    assert len(worker_threads) >= 2


class _Orthogonal(nn.Module):
    """orthogonal_ runs LAPACK's QR, whose bits depend on torch's intra-op threads
    (Hugging Face's RWKV embeddings): workers must keep the caller's setting."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 128) for _ in range(8))
        for layer in self.layers:
            nn.init.orthogonal_(layer.weight)
        self.rows = nn.Parameter(torch.empty(3000, 1000).normal_())  # runs: jumps to reach


@pytest.mark.parametrize("threads", [2, 3])
def test_kernels_whose_bits_depend_on_intra_op_threads_are_eager(threads, worker_threads):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(4)
        eager = _Orthogonal()
        torch.manual_seed(4)
        deferred = torchdefer.deferred_init(_Orthogonal)
        with concurrent.budget(1 << 30):
            torchdefer.materialize_module(deferred, threads=threads)
        assert_same_module(deferred, eager)
        assert worker_threads and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_jump_beside_other_threads_leaves_the_intra_op_setting_alone():
    from torchdefer.rng import mt19937

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with mt19937.one_thread():
            alone = torch.get_num_threads()
        with mt19937.intra_op_shared(), mt19937.one_thread():
            beside = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert (alone, beside) == (1, 2)


def test_budget_zero_keeps_one_tensor_in_flight(worker_threads):
    with concurrent.budget(0):
        eager, deferred, _, _ = _build_both()
        torchdefer.materialize_module(deferred, threads=4)
    assert_same_module(deferred, eager)
    assert not worker_threads


def test_side_by_side_is_the_default(worker_threads):
    def materialize():  # in a fresh context: every setting at its default
        eager, deferred, _, _ = _build_both()
        torchdefer.materialize_module(deferred, threads=4)
        return eager, deferred

    eager, deferred = contextvars.Context().run(materialize)
    assert_same_module(deferred, eager)
    assert worker_threads
