"""Row replay: a slice of a parameter computed from its own elements, bit for bit eager's.

Each test builds a parameter eagerly and deferred from one seed, takes rows
``[a, b)`` of the deferred one the ways sharding does (``split`` then
``clone`` as DTensor does, a padded copy as FSDP2 does, a plain view), and
replays the slice with the row hook. The result must equal the eager slice;
where the history allows it, the hook must have computed the slice (and drawn
only its rows), elsewhere it must have declined and left it to the replay.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import torchdefer
from parity import trunc_normal_reads_data
from torchdefer.distributed._rows import RowReplay
from torchdefer.materialize import Replay

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]

# In-place init steps: (name, fn(w), sliceable on any shape; "normal": only
# from 16 elements on, below which normal_ draws cached normal pairs).
STEPS = {
    "uniform": (lambda w: w.uniform_(-0.3, 0.7), True),
    "normal": (lambda w: w.normal_(0.5, 2.0), "normal"),
    "kaiming": (lambda w: nn.init.kaiming_uniform_(w, a=math.sqrt(5)), True),
    "random": (lambda w: w.random_(0, 50), True),
    "exponential": (lambda w: w.exponential_(1.5), True),
    "cauchy": (lambda w: w.cauchy_(), True),
    "geometric": (lambda w: w.geometric_(0.3), True),
    "bernoulli": (lambda w: w.bernoulli_(0.25), True),
    "fill": (lambda w: w.fill_(1.25), True),
    "zero": (lambda w: w.zero_(), True),
    "scale": (lambda w: w.mul_(0.5).add_(3), True),
    "clamp": (lambda w: w.clamp_(-0.5, 0.5), True),
    "row": (lambda w: w[w.shape[0] // 2].fill_(-7), True),  # embedding padding_idx
    "copy": (lambda w: w.copy_(torch.rand(w.shape, dtype=w.dtype)), True),
    "erfinv": (lambda w: w.uniform_(-0.9, 0.9).erfinv_().mul_(0.02), True),  # old trunc_normal_
    "half_way": (lambda w: w.copy_(w.double().mul(2).to(w.dtype)), True),
}
READERS = {"scale", "clamp", "row", "half_way"}  # steps that read the values they change
CREATORS = {
    "empty": lambda shape, dtype: torch.empty(shape, dtype=dtype),
    "zeros": lambda shape, dtype: torch.zeros(shape, dtype=dtype),
    "full": lambda shape, dtype: torch.full(shape, 0.25, dtype=dtype),
    "randn": lambda shape, dtype: torch.randn(shape, dtype=dtype),
    "rand": lambda shape, dtype: torch.rand(shape, dtype=dtype),
    "normal": lambda shape, dtype: torch.normal(0.5, 2.0, shape, dtype=dtype),
}


def _slice(full: torch.Tensor, a: int, b: int, how: str) -> torch.Tensor:
    """Rows ``[a, b)`` of ``full``, recorded as sharding records them."""
    if how == "clone":  # distribute_tensor(..., Shard(0)): split then clone
        return full[a:b].clone()
    if how == "padded":  # fully_shard: a padded flat shard, the rows copied in, a view
        shard = full.new_zeros((b - a + 1, *full.shape[1:]))
        shard[: b - a].copy_(full.narrow(0, a, b - a))
        return shard[: b - a]
    return full[a:b]  # the rows as a view of the full parameter


def _with_rows(t: torch.Tensor) -> tuple[torch.Tensor, RowReplay]:
    replay = Replay(t._graph, None)
    targets = [(t._value, t._value.storage.version)]
    rows = RowReplay(replay, targets)
    return replay.run(targets, substitute=rows)[0], rows


def _build_both(build):
    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    return eager, torchdefer.deferred_init(build)


def _check(build, a: int, b: int, how: str, expect_rows: bool) -> RowReplay:
    eager, full = _build_both(build)
    local = _slice(full, a, b, how)
    real, rows = _with_rows(local)
    expected = eager[a:b]
    assert real.dtype == expected.dtype and real.shape == expected.shape
    assert torch.equal(real, expected), f"rows {a}:{b} ({how}) differ from the eager slice"
    if expect_rows:
        assert rows.answered(local._value), rows.why_not(local._value)
    return rows


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    creator=st.sampled_from(sorted(CREATORS)),
    steps=st.lists(st.sampled_from(sorted(STEPS)), max_size=4),
    dtype=st.sampled_from(DTYPES),
    rows_cols=st.tuples(st.integers(1, 37), st.integers(1, 19)),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    how=st.sampled_from(["clone", "padded", "view"]),
)
def test_rows_of_any_init_program_are_the_eager_slice(creator, steps, dtype, rows_cols, cut, how):
    shape = rows_cols
    a = int(cut[0] * (shape[0] - 1))
    b = a + 1 + int(cut[1] * (shape[0] - 1 - a))

    if creator == "empty" and (not steps or steps[0] in READERS):
        steps = ["uniform", *steps]  # eager's uninitialized memory is no reference

    def build():
        w = CREATORS[creator](shape, dtype)
        for name in steps:
            STEPS[name][0](w)
        return w

    numel = math.prod(shape)
    sliceable = all(STEPS[s][1] is True or numel >= 16 for s in steps)
    if creator in ("randn", "normal"):
        sliceable = sliceable and numel >= 16
    eager, full = _build_both(build)
    local = _slice(full, a, b, how)
    real, rows = _with_rows(local)
    assert torch.equal(real, eager[a:b]), f"rows {a}:{b} of {creator} + {steps} ({how}) differ"
    if sliceable:
        assert rows.answered(local._value), rows.why_not(local._value)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_rows", [7, 16, 33])
def test_a_rank_draws_only_its_rows_and_skips_overwritten_init(dtype, n_rows):
    """Linear init (kaiming uniform) then normal_, as Hugging Face does: only the
    rows' normals are drawn (plus at most three Box-Muller blocks)."""

    def build():
        w = torch.empty(n_rows, 5, dtype=dtype)
        nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        return w.normal_(0, 0.02)

    world = 4
    bounds = [min(n_rows, r * -(-n_rows // world)) for r in range(world + 1)]
    for a, b in itertools.pairwise(bounds):
        if a == b:
            continue
        rows = _check(build, a, b, "padded", expect_rows=True)
        assert (b - a) * 5 <= rows.drawn <= (b - a) * 5 + 3 * 16, rows.drawn


def test_dtype_conversion_after_init_slices_through_the_conversion():
    def build():
        layer = nn.Linear(40, 33)
        return layer.to(torch.bfloat16).weight.detach()

    for a, b in [(0, 9), (9, 18), (30, 33)]:
        rows = _check(build, a, b, "clone", expect_rows=True)
        assert rows.drawn <= (b - a) * 40


def test_explicit_generators_and_large_tensors_slice_from_their_own_stream():
    def build():
        g = torch.Generator().manual_seed(7)
        w = torch.empty(300, 257)  # 77,100 elements: past any small-size code path
        w.normal_(generator=g)
        x = torch.empty(257, 300).uniform_(-1, 1)  # the default stream moves meanwhile
        return w.add_(x.t().contiguous().mul(0))  # x mixes nothing in, but is read whole

    _check(build, 100, 211, "clone", expect_rows=False)

    def plain():
        g = torch.Generator().manual_seed(7)
        return torch.empty(300, 257).normal_(generator=g).mul_(3)

    rows = _check(plain, 100, 211, "clone", expect_rows=True)
    assert rows.drawn <= 111 * 257 + 3 * 16


FALLBACKS = {
    "orthogonal": lambda w: nn.init.orthogonal_(w),
    "matmul": lambda w: w.copy_(torch.randn(w.shape[0], 3) @ torch.randn(3, w.shape[1])),
    "bernoulli_tensor": lambda w: w.bernoulli_(torch.full(w.shape, 0.3)),
    "strided_normal": lambda w: w.t().normal_(),
    "small_normal": lambda w: w.zero_()[12, :5].normal_(),  # under 16: cached normal pairs
    "log_normal": lambda w: w.log_normal_(),
    "broadcast_add": lambda w: w.normal_().add_(torch.randn(w.shape[1])),
}


@pytest.mark.parametrize("name", sorted(FALLBACKS))
def test_ops_that_mix_elements_fall_back_and_stay_bit_for_bit(name):
    def build():
        w = torch.empty(29, 6)
        FALLBACKS[name](w)
        return w

    eager, full = _build_both(build)
    local = _slice(full, 10, 20, "clone")
    real, rows = _with_rows(local)
    assert torch.equal(real, eager[10:20])
    assert not rows.answered(local._value)
    assert rows.why_not(local._value), "a fallback says which op stopped it"


def test_trunc_normal_with_unreachable_bounds_comes_from_its_own_rows():
    def build():
        w = torch.empty(29, 6)
        nn.init.trunc_normal_(w, std=0.02)  # torchtitan's default bounds: 100 sigma
        return w

    eager, full = _build_both(build)
    local = _slice(full, 10, 20, "clone")
    real, rows = _with_rows(local)
    assert torch.equal(real, eager[10:20])
    assert rows.answered(local._value), rows.why_not(local._value)
    assert rows.drawn <= 10 * 6 + 2 * 16  # its rows and at most two partial blocks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_rejection_loop_shard_pays_its_own_rounds_from_its_own_rows(dtype):
    def build():
        w = torch.empty(61, 6, dtype=dtype)
        nn.init.trunc_normal_(w, std=0.02, a=-0.04, b=0.04)  # two sigma: redrawn
        return w, torch.randn(3)

    eager, (full, _) = _build_both(build)
    local = _slice(full, 10, 20, "clone")
    real, rows = _with_rows(local)
    assert torch.equal(real, eager[0][10:20])
    if not trunc_normal_reads_data():
        return
    assert rows.answered(local._value), rows.why_not(local._value)
    # every round draws at most the range still waiting, plus two partial blocks
    assert rows.drawn < 61 * 6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_uniform_loop_shard_pays_its_own_rounds_from_its_own_rows(dtype):
    def build():
        w = torch.empty(61, 6, dtype=dtype)
        nn.init.trunc_normal_(w, std=0.02, a=-0.005, b=0.005)  # a quarter sigma: p <= 0.3
        return w, torch.randn(3)

    eager, (full, _) = _build_both(build)
    local = _slice(full, 10, 20, "clone")
    real, rows = _with_rows(local)
    assert torch.equal(real, eager[0][10:20])
    # Since torch 2.12 the uniform loop (rng.uniform_rejection); before, erfinv of a uniform.
    assert rows.answered(local._value), rows.why_not(local._value)
    if trunc_normal_reads_data():
        assert rows.drawn < 2 * 61 * 6  # a round draws two uniforms a waiting element


def test_a_uniform_loop_whose_decision_the_paths_round_differently_falls_back(monkeypatch):
    from torchdefer.rng import _uniform_rejection as uniform_rejection

    if not trunc_normal_reads_data():
        pytest.skip("before torch 2.12 trunc_normal_ has no uniform loop")
    original = uniform_rejection._scalar

    def other_log(values, op):
        out = original(values, op)
        return out.fill_(float("inf")) if op is torch.Tensor.log_ else out

    def build():
        w = torch.empty(29, 6)
        nn.init.trunc_normal_(w, std=0.02, a=-0.005, b=0.005)
        return w

    eager, full = _build_both(build)
    monkeypatch.setattr(uniform_rejection, "_scalar", other_log)
    local = _slice(full, 10, 20, "clone")
    real, rows = _with_rows(local)
    assert torch.equal(real, eager[10:20])
    assert not rows.answered(local._value)
    assert "rounds differently" in rows.why_not(local._value)


@pytest.mark.parametrize("rows_taken", [(0, 10), (3, 8), (8, 30), (40, 50), (0, 50)])
def test_a_rejection_loop_on_a_part_of_a_storage_slices_by_rows(rows_taken):
    def build():
        w = torch.zeros(50, 6)
        nn.init.trunc_normal_(w[5:45], std=1.0, a=-1.5, b=1.5)  # elements 30 to 270
        return w

    eager, full = _build_both(build)
    a, b = rows_taken
    local = _slice(full, a, b, "clone")
    real, rows = _with_rows(local)
    assert torch.equal(real, eager[a:b])
    if trunc_normal_reads_data():
        assert rows.answered(local._value), rows.why_not(local._value)


def test_column_slices_fall_back_and_stay_bit_for_bit():
    eager, full = _build_both(lambda: torch.randn(12, 10))
    local = full[:, 3:7].clone()
    real, rows = _with_rows(local)
    assert torch.equal(real, eager[:, 3:7])
    assert not rows.answered(local._value)


def test_writes_after_the_slice_was_taken_do_not_reach_it():
    def build():
        w = torch.randn(20, 4)
        taken = w[5:15].clone()
        w.mul_(2)
        return w, taken

    eager, (full, taken) = _build_both(build)
    local = full[5:15].clone()  # after the write
    real, rows = _with_rows(taken)
    assert torch.equal(real, eager[1])
    assert rows.answered(taken._value)
    real, _ = _with_rows(local)
    assert torch.equal(real, eager[0][5:15])


def test_a_view_read_before_a_later_write_is_left_to_the_replay():
    def build():
        w = torch.randn(20, 4)
        view = w[5:15]
        w.add_(1)  # the view, read at its last version, sees this
        return view

    eager, view = _build_both(build)
    real, _ = _with_rows(view)
    assert torch.equal(real, eager)


def test_shared_storage_of_a_padded_shard_stays_shared():
    eager, full = _build_both(lambda: torch.randn(10, 3))
    flat = full.new_zeros(12, 3)
    flat[:5].copy_(full[5:10])
    local = flat[:5]
    replay = Replay(full._graph, None)
    targets = [(flat._value, flat._value.storage.version), (local._value, local._value.storage.version)]
    rows = RowReplay(replay, targets)
    real_flat, real_local = replay.run(targets, substitute=rows)
    assert torch.equal(real_local, eager[5:10]) and torch.equal(real_flat[5:], torch.zeros(7, 3))
    assert real_local.untyped_storage().data_ptr() == real_flat.untyped_storage().data_ptr()


def _rows_on(t: torch.Tensor, device: torch.device | None) -> tuple[torch.Tensor, RowReplay]:
    replay = Replay(t._graph, device)
    targets = [(t._value, t._value.storage.version)]
    rows = RowReplay(replay, targets)
    return replay.run(targets, substitute=rows)[0], rows


def test_a_tensor_recorded_on_cuda_and_replayed_on_the_cpu_slices_with_the_cpu_generator():
    """On the CPU, a CUDA-recorded stream is replayed with the CPU generator (as
    materialize_tensor(t, device="cpu") does); its rows follow the same model."""
    torch.manual_seed(0)
    full = torchdefer.deferred_init(lambda: torch.randn(40, 9, device="cuda").mul_(2))
    local = full[10:25].clone()
    real, rows = _rows_on(local, torch.device("cpu"))
    assert rows.answered(local._value), rows.why_not(local._value)
    assert torch.equal(real, torchdefer.materialize_tensor(full, device="cpu")[10:25])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rows_replayed_on_cuda_fall_back_to_the_full_parameter():
    """Philox gives each thread its own offsets, not each element its own words."""
    torch.manual_seed(0)
    full = torchdefer.deferred_init(lambda: torch.randn(40, 9, device="cuda"))
    local = full[10:25].clone()
    real, rows = _rows_on(local, None)
    assert not rows.answered(local._value)
    assert torch.equal(real, torchdefer.materialize_tensor(full)[10:25])
