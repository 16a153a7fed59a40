"""Replay never borrows the CPU default generator: calls recorded without ``generator=``
run as their overload that takes one, on a private generator, bit for bit eager's.

Threads drawing at once (the chunks of a split call, a sharded rank's rows)
then never share a generator, so they need no lock; the default generator is
borrowed only where no overload takes one (a CUDA call, an op without such a
sibling).
"""

from __future__ import annotations

import threading

import pytest
import torch

import torchdefer
from torchdefer.distributed._rows import RowReplay
from torchdefer.materialize import Replay
from torchdefer.materialize import _parallel as parallel
from torchdefer.materialize import _rng_replay as replay_rng

# Each builds a tensor through an overload that draws from the default generator.
CALLS = {
    "randn.default": lambda n: torch.randn(n, 3),
    "rand.default": lambda n: torch.rand(n, 3, dtype=torch.float64),
    "randint.default": lambda n: torch.randint(7, (n, 3)),
    "randint.low": lambda n: torch.randint(-5, 9, (n, 3), dtype=torch.int32),
    "randn_like.default": lambda n: torch.randn_like(torch.zeros(n, 3, dtype=torch.bfloat16)),
    "rand_like.default": lambda n: torch.rand_like(torch.zeros(n, 3)),
    "randint_like.default": lambda n: torch.randint_like(torch.zeros(n, 3), 11),
    "randint_like.low_dtype": lambda n: torch.randint_like(torch.zeros(n, 3), 2, 11),
    "randn.out": lambda n: torch.randn(n, 3, out=torch.empty(n, 3)),
    "randint.low_out": lambda n: torch.randint(1, 4, (n, 3), out=torch.empty(n, 3)),
}


@pytest.fixture
def borrowed(monkeypatch):
    """The threads that borrowed a default generator during the test."""
    names: list[str] = []
    real = replay_rng._borrowing_default

    def spy(*args, **kwargs):
        names.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(replay_rng, "_borrowing_default", spy)
    return names


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("n", [5, 1001])
def test_default_generator_calls_replay_on_private_generators(name, threads, n, borrowed):
    build = CALLS[name]
    torch.manual_seed(3)
    eager = build(n)
    after = torch.default_generator.get_state()
    torch.manual_seed(3)
    deferred = torchdefer.deferred_init(build, n)
    assert torch.equal(torch.default_generator.get_state(), after)
    with parallel.min_chunk(16):
        got = torchdefer.materialize_tensor(deferred, threads=threads)
    assert torch.equal(got, eager) and got.dtype == eager.dtype
    assert torch.equal(torch.default_generator.get_state(), after)  # never moved
    if _has_sibling(name):
        assert borrowed == []
    # else (the *_like ops before torch 2.12): no overload takes generator=, so the
    # default generator is borrowed, under its lock; the bits above are eager's


def _has_sibling(name: str) -> bool:
    packet, overload = name.split(".")
    return replay_rng._sibling_of(getattr(getattr(torch.ops.aten, packet), overload)) is not None


@pytest.mark.parametrize("threads", [2, 3, 4])
def test_rows_on_threads_never_borrow_the_default_generator(threads, borrowed):
    def build():
        return torch.randn(301, 29)[37:290].clone()

    torch.manual_seed(5)
    eager = build()
    torch.manual_seed(5)
    deferred = torchdefer.deferred_init(build)
    replay = Replay(deferred._graph, None)
    targets = [(deferred._value, deferred._value.storage.version)]
    rows = RowReplay(replay, targets)
    with parallel.threads_used(threads), parallel.min_chunk(16):
        got = replay.run(targets, substitute=rows)[0]
    assert torch.equal(got, eager)
    assert rows.drawn < 301 * 29  # rows, not the whole parameter
    assert borrowed == []


def test_the_generator_overload_is_the_sibling_with_the_same_other_arguments():
    class Node:
        def __init__(self, op):
            self.op = op

    aten = torch.ops.aten
    pairs = {aten.randn.default: aten.randn.generator, aten.randint.low: aten.randint.low_generator,
             aten.rand.out: aten.rand.generator_out}
    if "Tensor_generator" in aten.randint_like.overloads():  # torch 2.12 on
        pairs[aten.randint_like.Tensor] = aten.randint_like.Tensor_generator
    for op, sibling in pairs.items():
        assert replay_rng.generator_overload(Node(op)).op is sibling
    # Taking generator= already, or no sibling: nothing to switch to.
    for op in (aten.randn.generator, aten.normal_.default, aten.add.Tensor):
        assert replay_rng.generator_overload(Node(op)) is None


def test_a_thread_drawing_from_the_default_generator_meanwhile_changes_nothing():
    """Replay never sets the process's default generator, so another thread drawing
    from it during materialization neither shifts the replayed values nor sees
    replay's states (both could happen while replay borrowed it)."""
    build = CALLS["randn.default"]
    torch.manual_seed(8)
    eager = build(3)
    deferred = []
    for _ in range(200):
        torch.manual_seed(8)
        deferred.append(torchdefer.deferred_init(build, 3))
    saved = torch.default_generator.get_state()
    stop = threading.Event()
    seen: list[bool] = []

    def user_thread() -> None:
        torch.default_generator.manual_seed(99)
        expected = torch.Generator().manual_seed(99)
        while not stop.is_set():
            seen.append(torch.equal(torch.randn(64), torch.randn(64, generator=expected)))

    worker = threading.Thread(target=user_thread)
    worker.start()
    try:
        got = [torchdefer.materialize_tensor(d, threads=1) for d in deferred]
    finally:
        stop.set()
        worker.join()
        torch.default_generator.set_state(saved)
    assert all(torch.equal(g, eager) for g in got)
    assert seen and all(seen)
