"""threads=1..4 give eager's bits on every random op the draw model knows, in every dtype.

Each case builds a tensor eagerly and deferred from one seed and materializes
it with 1 to 4 threads, chunks made small (``parallel.min_chunk``) so that
sizes of a few thousand elements split at odd places: sizes and chunk floors
come from hypothesis, around the boundaries that matter (Box-Muller blocks of
16, refills of 624 words, the tail of 16 recomputed elements). The calls that
split are counted, so a case that should split and silently ran whole fails.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchdefer
from torchdefer.materialize import _parallel as parallel
from torchdefer.rng import _chunks as chunks

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
ALL = (torch.bool, *INTS, *FLOATS)
COMPLEX = (torch.complex64, torch.complex128)


def _inplace(method, *args, **kwargs):
    def build(n, dtype, generator=None):
        extra = {} if generator is None else {"generator": generator}
        return getattr(torch.empty(n, dtype=dtype), method)(*args, **kwargs, **extra)

    return build


def _factory(fn, *args, **kwargs):
    def build(n, dtype, generator=None):
        extra = {} if generator is None else {"generator": generator}
        return fn(*args, size=(n,), dtype=dtype, **kwargs, **extra)

    return build


def _like(fn, **kwargs):
    def build(n, dtype, generator=None):
        return fn(torch.empty(n, dtype=dtype), **kwargs)

    return build


# (name, build, dtypes, splits): every op of rng.draws' families, in the forms
# PyTorch's Python API reaches them. `splits`: whether a call of >= 2 chunks
# is drawn on threads (False: run whole, by design: see rng/_chunks.py).
CASES = [
    ("normal_", _inplace("normal_", 0.5, 2.0), FLOATS, True),
    ("randn", _factory(torch.randn), FLOATS, True),
    ("normal(float, float)", lambda n, d, generator=None: torch.normal(
        0.5, 2.0, (n,), dtype=d, generator=generator), FLOATS, True),
    ("randn_like", _like(torch.randn_like), FLOATS, None),
    # Complex normals draw through a real view of twice the elements; the draw
    # model does not count them (unmodeled), so they run whole.
    ("normal_ complex", _inplace("normal_", 0.5, 2.0), COMPLEX, False),
    ("randn complex", _factory(torch.randn), COMPLEX, False),
    ("normal_ strided", lambda n, d, generator=None: torch.empty(n, 3, dtype=d)[:, 1].normal_(
        generator=generator), FLOATS, False),
    ("normal(Tensor)", lambda n, d, generator=None: torch.normal(
        torch.zeros(n, dtype=d), 1.0, generator=generator), FLOATS, False),
    ("log_normal_", _inplace("log_normal_", 0.0, 0.25), FLOATS, True),  # pairs of normals
    ("uniform_", _inplace("uniform_", -0.3, 0.7), FLOATS, True),
    ("rand", _factory(torch.rand), FLOATS, True),
    ("rand_like", _like(torch.rand_like), FLOATS, None),
    ("random_", _inplace("random_"), ALL, True),
    ("random_(to)", _inplace("random_", 100), (*INTS, *FLOATS), True),
    ("random_(from, to)", _inplace("random_", -3, 100), (*INTS[1:], *FLOATS), True),
    ("random_(2**40)", _inplace("random_", 0, 2**40), (torch.int64, torch.float64), True),
    ("randint", lambda n, d, generator=None: torch.randint(
        -5, 50, (n,), dtype=d, generator=generator), (*INTS[1:], *FLOATS), True),
    ("randint_like", _like(torch.randint_like, low=0, high=7), (*INTS, *FLOATS), None),
    ("bernoulli_(p)", _inplace("bernoulli_", 0.3), ALL, None),
    ("bernoulli(Tensor)", lambda n, d, generator=None: torch.bernoulli(
        torch.full((n,), 0.25, dtype=d), generator=generator), FLOATS, False),
    ("exponential_", _inplace("exponential_", 1.5), FLOATS, None),
    ("geometric_", _inplace("geometric_", 0.2), (*INTS, *FLOATS), True),
    ("cauchy_", _inplace("cauchy_", 0.0, 1.0), FLOATS, True),
    ("dropout", lambda n, d, generator=None: torch.nn.functional.dropout(
        torch.ones(n, dtype=d), 0.25), FLOATS, None),  # bernoulli_(p) inside
    ("randperm", lambda n, d, generator=None: torch.randperm(
        n, dtype=d, generator=generator), (torch.int64, torch.float32), False),
]
IDS = [c[0] for c in CASES]


@pytest.fixture(params=[1, 2], ids=["intra-op-1", "intra-op-2"])
def intra_op(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    try:
        yield request.param
    finally:
        torch.set_num_threads(before)


class _Count:
    """How many calls were drawn in two chunks or more."""

    def __init__(self, monkeypatch):
        self.split = 0
        real = chunks.draw_chunks

        def counting(model, out, state, run, starts):
            self.split += len(starts) > 2
            return real(model, out, state, run, starts)

        real_pairs = chunks.draw_pairs

        def counting_pairs(out, state, run, starts):
            self.split += len(starts) > 2 and out.numel() > 100  # not the probe's
            return real_pairs(out, state, run, starts)

        monkeypatch.setattr(chunks, "draw_chunks", counting)
        monkeypatch.setattr(chunks, "draw_pairs", counting_pairs)


def _check(build, n, dtype, threads, floor, user_generator, seed=0):
    """Eager vs deferred + materialize(threads); returns nothing, asserts all."""
    gen = torch.Generator().manual_seed(seed + 1) if user_generator else None
    torch.manual_seed(seed)
    eager = build(n, dtype, gen)
    eager_states = (torch.get_rng_state(), gen.get_state() if gen else None)
    gen = torch.Generator().manual_seed(seed + 1) if user_generator else None
    torch.manual_seed(seed)
    deferred = torchdefer.deferred_init(build, n, dtype, gen)
    with parallel.min_chunk(floor):
        real = torchdefer.materialize_tensor(deferred, threads=threads)
    assert real.dtype == eager.dtype and real.stride() == eager.stride()
    assert torch.equal(real, eager), f"values differ (n={n}, threads={threads}, floor={floor})"
    # Materializing moves no generator: both stay where eager left them.
    assert torch.equal(torch.get_rng_state(), eager_states[0])
    if user_generator:
        assert torch.equal(gen.get_state(), eager_states[1])


_SIZES = st.one_of(
    st.integers(16, 6000),
    st.integers(1, 6).flatmap(lambda k: st.integers(1248 * k - 17, 1248 * k + 17)),
    st.integers(1, 9).flatmap(lambda k: st.integers(624 * k - 3, 624 * k + 3)),
)


@pytest.mark.parametrize("name,build,dtypes,splits", CASES, ids=IDS)
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_threads_give_eager_bits(name, build, dtypes, splits, intra_op, monkeypatch, data):
    dtype = data.draw(st.sampled_from(dtypes), label="dtype")
    n = data.draw(_SIZES, label="n")
    threads = data.draw(st.integers(1, 4), label="threads")
    floor = data.draw(st.sampled_from([16, 100, 624, 1000, 1248]), label="floor")
    user_generator = data.draw(st.booleans(), label="user_generator")
    _check(build, n, dtype, threads, floor, user_generator)
    assert torch.get_num_threads() == intra_op


@pytest.mark.parametrize("name,build,dtypes,splits", CASES, ids=IDS)
def test_each_op_splits_or_runs_whole_as_documented(name, build, dtypes, splits, monkeypatch):
    """The ops documented to split do, in every dtype; the others run whole.

    ``None``: depends on this machine's kernels (MKL's bernoulli_/exponential_
    take one seed word for the whole call) or on whether the overload takes a
    generator (``*_like``); either way the bits are checked above.
    """
    for dtype in dtypes:
        count = _Count(monkeypatch)
        _check(build, 5003, dtype, threads=3, floor=1000, user_generator=False)
        if splits is not None:
            assert bool(count.split) == splits, f"{name} {dtype}: split={count.split}"


def test_sizes_at_every_chunk_boundary_of_a_blocked_fill(monkeypatch):
    """normal_ float32 and bfloat16, n from 2 chunks - 20 to 2 chunks + 20 (tail rule)."""
    count = _Count(monkeypatch)
    for dtype in (torch.float32, torch.bfloat16):
        for n in range(2 * 1248 - 20, 2 * 1248 + 21):
            _check(CASES[0][1], n, dtype, threads=2, floor=1248, user_generator=False)
    assert count.split > 0


def test_log_normal_splits_after_whole_pairs_with_or_without_a_cached_normal(monkeypatch):
    """log_normal_ takes a cached normal first if the generator holds one; chunks
    start after whole pairs either way, and the end state (cache included) is the
    whole call's: the small normal_ after it reads that cache."""
    count = _Count(monkeypatch)

    def build(n, dtype, generator=None):
        first = torch.empty(n % 4, dtype=torch.float64).normal_()  # 1 or 3: leaves a cache
        mid = torch.empty(n, dtype=dtype).log_normal_(0.5, 0.25)
        last = torch.empty(3, dtype=torch.float64).normal_()
        return torch.cat([first, mid.double(), last])

    for n in (2 * 312 + 1, 3 * 312 + 2, 5000, 5001, 5002, 5003):
        for threads in (2, 3, 4):
            _check(build, n, torch.float32, threads, floor=300, user_generator=False)
    assert count.split > 0


def test_a_cached_normal_before_a_split_call_stays_cached(monkeypatch):
    """A 3-element normal_ leaves a cached normal sample in the generator; a large
    uniform_ (split) after it must leave that cache as eager does, and the next
    small normal_ must use it."""
    count = _Count(monkeypatch)

    def build(n, dtype, generator=None):
        a = torch.empty(3, dtype=torch.float64).normal_()
        b = torch.empty(n, dtype=dtype).uniform_()
        c = torch.empty(3, dtype=torch.float64).normal_()
        return torch.cat([a, b.double(), c])

    for threads in (1, 2, 4):
        _check(build, 9999, torch.float32, threads, floor=1000, user_generator=False)
    assert count.split > 0
