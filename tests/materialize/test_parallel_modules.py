"""threads= on whole modules, at the real chunk size: eager's bits, eager's generators.

Tensors here are large enough (9M elements) that chunks start more than 4M
words apart, so chunk states are reached by GF(2) jumps, not by drawing.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module, assert_same_tensor
from torchdefer.errors import ThreadsError
from torchdefer.materialize import _parallel as parallel
from torchdefer.materialize._value import replay_value
from torchdefer.rng import _chunks as chunks


class _Big(nn.Module):
    """Large fills of every splitting kind, from the default and a user generator."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.proj = nn.Linear(3000, 3000)  # kaiming uniform_ (9M), bias uniform_
        nn.init.normal_(self.proj.weight, std=0.02)  # hides the uniform_ (not drawn)
        self.embed = nn.Embedding(5001, 1799)  # normal_, 9M, odd: the tail rule
        self.register_buffer("mask", torch.randint(0, 7, (3001, 1500), generator=generator))
        self.wide = nn.Parameter(torch.randn(3001, 1501, dtype=torch.bfloat16))
        self.small = nn.Linear(8, 8)  # stays whole


def _build_both(seed: int = 3):
    g = torch.Generator().manual_seed(seed + 7)
    torch.manual_seed(seed)
    eager = _Big(g)
    states = (torch.get_rng_state(), g.get_state())
    g = torch.Generator().manual_seed(seed + 7)
    torch.manual_seed(seed)
    deferred = torchdefer.deferred_init(_Big, g)
    return eager, deferred, states, g


@pytest.fixture(params=[1, 2], ids=["intra-op-1", "intra-op-2"])
def intra_op(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    try:
        yield request.param
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def split_count(monkeypatch):
    count = {"split": 0}
    real = chunks.draw_chunks

    def counting(model, out, state, run, starts):
        count["split"] += len(starts) > 2
        return real(model, out, state, run, starts)

    monkeypatch.setattr(chunks, "draw_chunks", counting)
    return count


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_module_materialized_with_threads_is_eager(threads, intra_op, split_count):
    eager, deferred, states, g = _build_both()
    torchdefer.materialize_module(deferred, threads=threads)
    assert_same_module(deferred, eager)
    assert torch.equal(torch.get_rng_state(), states[0])
    assert torch.equal(g.get_state(), states[1])
    assert torch.get_num_threads() == intra_op
    assert (split_count["split"] >= 4) == (threads > 1)


@pytest.mark.parametrize("threads", [2, 4])
def test_any_order_with_threads(threads):
    """Reverse order jumps to each start; in order, each call starts where the split
    call before it ended (the state it leaves must be the whole call's)."""
    eager, deferred, _, _ = _build_both(seed=11)
    names = ["wide", "mask", "embed.weight", "proj.bias", "proj.weight"]
    for name in names:
        real = torchdefer.materialize_tensor(deferred.get_parameter(name) if "mask" not in name
                                             else deferred.mask, threads=threads)
        ref = eager.get_parameter(name) if "mask" not in name else eager.mask
        assert torch.equal(real, ref), name
    _, deferred, _, _ = _build_both(seed=11)
    for name in reversed(names):
        t = deferred.mask if name == "mask" else deferred.get_parameter(name)
        ref = eager.mask if name == "mask" else eager.get_parameter(name)
        assert torch.equal(torchdefer.materialize_tensor(t, threads=threads), ref), name


def test_threads_default_to_torch_intra_op_setting(split_count):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        eager, deferred, _, _ = _build_both()
        torchdefer.materialize_module(deferred)
        assert split_count["split"] == 0
        assert_same_module(deferred, eager)
        torch.set_num_threads(2)
        eager, deferred, _, _ = _build_both()
        torchdefer.materialize_module(deferred)
        assert split_count["split"] >= 4
        assert_same_module(deferred, eager)
    finally:
        torch.set_num_threads(before)


def test_replay_value_takes_threads(split_count):
    eager, deferred, _, _ = _build_both()
    value = replay_value(deferred.embed.weight, "embed.weight", threads=3)
    assert torch.equal(value, eager.embed.weight)
    assert split_count["split"] == 1
    assert torchdefer.is_deferred(deferred)


def test_inference_mode_recordings_split_on_threads_in_inference_mode(split_count):
    """Grad and inference mode are per thread: chunk threads must use the replay's."""
    def build():
        with torch.inference_mode():
            return torch.empty(3001, 1499).normal_()

    torch.manual_seed(5)
    eager = build()
    torch.manual_seed(5)
    deferred = torchdefer.deferred_init(build)
    with parallel.min_chunk(100_000):
        real = torchdefer.materialize_tensor(deferred, threads=4)
    assert real.is_inference() and torch.equal(real, eager)
    assert split_count["split"] == 1


@pytest.mark.parametrize("threads", [0, -2, True, 2.0, "2"])
def test_bad_threads_are_refused_naming_the_call(threads):
    m = torchdefer.deferred_init(nn.Linear, 4, 4)
    with pytest.raises(ThreadsError, match=r"materialize_module\(threads=") as info:
        torchdefer.materialize_module(m, threads=threads)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, torchdefer.TorchdeferError)
    with pytest.raises(ThreadsError, match=r"materialize_tensor\(threads="):
        torchdefer.materialize_tensor(m.weight, threads=threads)
    with pytest.raises(ThreadsError, match=r"replay_value\(threads="):
        replay_value(m.weight, "weight", threads=threads)
    assert torchdefer.is_deferred(m)


def test_a_failing_chunk_fails_the_call_after_every_chunk_ended():
    state = torch.Generator().manual_seed(0).get_state()
    from torchdefer.rng._ranges import ElementModel

    out = torch.zeros(4 * 624)
    ended = []

    def run(view, start):
        if view.data_ptr() != out.data_ptr():
            raise RuntimeError("chunk failed")
        view.fill_(1)
        ended.append(True)
        return start

    with pytest.raises(RuntimeError, match="chunk failed"):
        chunks.draw_chunks(ElementModel(False, 1), out, state, run, [0, 624, 1248, 2496])
    assert ended == [True] and out[:624].eq(1).all()


def test_factory_output_is_eager_layout():
    torch.manual_seed(0)
    eager = torch.randn(2049, 1025)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(torch.randn, 2049, 1025)
    assert_same_tensor(torchdefer.materialize_tensor(deferred, threads=2), eager)


@pytest.mark.parametrize(
    "build",
    [
        lambda: torch.randn(3001, 1499),
        lambda: torch.rand(3001, 1499, dtype=torch.float64),
        lambda: torch.randint(-4, 99, (3001, 1499)),
        lambda: torch.normal(2.0, 3.0, (3001, 1499)),
        lambda: torch.randn(3001, 1499, generator=torch.Generator().manual_seed(3)),
    ],
    ids=["randn", "rand", "randint", "normal", "randn-generator"],
)
def test_factories_draw_chunks_straight_into_their_output(build, monkeypatch, split_count):
    """No chunk-sized temporary (peak stays the output's): the out= overload draws."""
    from torchdefer.materialize._local_call import LocalCall

    copied = []
    real = LocalCall.run

    def spying(self, out, state):
        if out.numel() > 1000:  # not rng.ranges' probe of a new class of call
            copied.append(out.numel())
        return real(self, out, state)

    monkeypatch.setattr(LocalCall, "run", spying)
    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    assert_same_tensor(torchdefer.materialize_tensor(deferred, threads=2), eager)
    assert split_count["split"] == 1 and copied == []


@pytest.fixture
def intra_op_two():
    """Two intra-op threads: the read's replay draws on torch.get_num_threads(),
    which earlier tests in the process (in tests/descriptors) can leave at 1."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _ReadsItsData(nn.Module):
    """A data-dependent read inside the recording: its replay splits, with threads
    started while the recording is live (recorder/_threads.py syncs the generator)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(3000, 2001))
        bound = float(self.a.detach().abs().mean())
        self.b = nn.Parameter(torch.empty(2500, 2003).uniform_(-bound, bound))
        self.c = nn.Parameter(torch.randn(7))


def test_a_split_replay_inside_a_recording_changes_nothing(split_count, intra_op_two):
    torch.manual_seed(0)
    eager = _ReadsItsData()
    after = torch.get_rng_state()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(_ReadsItsData)
    assert split_count["split"] == 1  # the read
    assert torch.equal(torch.get_rng_state(), after)
    torchdefer.materialize_module(deferred, threads=2)
    assert_same_module(deferred, eager)
    assert torch.equal(torch.get_rng_state(), after)


def _fills(device):
    a = torch.empty(3001, 1499, device=device).normal_()
    b = torch.randn(2101, 2101, device=device)
    c = torch.empty(4201, 1001, device=device).uniform_(-2, 2)
    return a, b, c


def test_a_fake_cuda_recording_replayed_on_the_cpu_splits_and_is_eager_cpu(split_count):
    """Recorded on (fake) CUDA, materialized with device='cpu': the CPU model's
    positions, drawn in chunks, in any order."""
    torch.manual_seed(3)
    eager = _fills("cpu")
    torch.manual_seed(3)
    deferred = torchdefer.deferred_init(_fills, "cuda")
    for i in (2, 0, 1):
        got = torchdefer.materialize_tensor(deferred[i], device="cpu", threads=2)
        assert torch.equal(got, eager[i]), i
    assert split_count["split"] == 3
