"""trunc_normal_'s loops on fewer than 16 or strided elements, stepped in chunks, end where
torch's own loop leaves the generator, and are never run whole while deferring."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import torchdefer
from parity import check_program, trunc_normal_reads_data
from torchdefer.materialize._rng_replay import RngReplay
from torchdefer.recorder._trunc_normal import rejection_loop
from torchdefer.rng import _rejection as rejection
from torchdefer.rng import _uniform_rejection as uniform_rejection
from torchdefer.rng import mt19937
from torchdefer.rng.draws import TensorInfo

pytestmark = pytest.mark.skipif(
    not trunc_normal_reads_data(), reason="trunc_normal_ is a rejection loop since torch 2.12"
)

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
RUN = nn.init._no_grad_trunc_normal_
# (mean, std, a, b): the normal_ branch (p > 0.3) with a few rounds, with rare
# rejections, off-centre; the uniform branch (p <= 0.3) centred and off the mean.
NORMAL = ((0.1, 1.0, -1.0, 1.2), (0.0, 1.0, -2.0, 2.0), (0.5, 2.0, -1.0, 3.0))
UNIFORM = ((0.0, 1.0, -0.3, 0.3), (2.0, 1.0, -0.5, 0.5))


def _strided(dims, perm, steps, dtype):
    """A view of ``dims`` elements taking every ``steps``-th of a bigger tensor, permuted."""
    base = torch.empty(*[d * s for d, s in zip(dims, steps)], dtype=dtype)
    return base[tuple(slice(None, None, s) for s in steps)].permute(*perm)


def _start(seed, cached):
    g = torch.Generator().manual_seed(seed)
    if cached:  # a double normal cached: the serial path's first element takes it
        torch.empty(1, dtype=torch.float64).normal_(generator=g)
    return g


def _eager_end(t, window, g):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 'mean is more than 2 std from [a, b]'
        nn.init.trunc_normal_(t, *window, generator=g)
    return g.get_state()


def _info(t):
    return TensorInfo(tuple(t.shape), t.stride(), t.dtype)


@st.composite
def layouts(draw):
    dims = draw(st.lists(st.integers(1, 12), min_size=1, max_size=3))
    perm = draw(st.permutations(range(len(dims))))
    steps = draw(st.lists(st.integers(1, 3), min_size=len(dims), max_size=len(dims)))
    return dims, perm, steps


@pytest.mark.parametrize("threads", [1, 2])
@settings(max_examples=60, deadline=None)
@given(
    layout=layouts(),
    dtype=st.sampled_from(DTYPES),
    window=st.sampled_from(NORMAL + UNIFORM),
    seed=st.integers(0, 2**31),
    cached=st.booleans(),
    chunk=st.sampled_from([None, 4, 6, 32]),
)
def test_a_loop_on_any_layout_ends_where_eager_leaves_the_generator(
    threads, layout, dtype, window, seed, cached, chunk
):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t = _strided(*layout, dtype)
        g = _start(seed, cached)
        start = g.get_state()
        want = _eager_end(t, window, g)
        loop = rejection_loop(_info(t), *window, run=RUN)
        assert loop is not None  # every non-overlapping layout is stepped
        got = loop.end(start, chunk) if chunk else loop.end(start)
        assert got is not None and torch.equal(got, want)
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 15, 16, 17, 31])
@pytest.mark.parametrize("cached", [False, True])
def test_sizes_around_16_end_and_slice_as_eager(dtype, n, cached):
    for window in NORMAL:
        g = _start(n, cached)
        start = g.get_state()
        whole = torch.empty(n, dtype=dtype)
        want = _eager_end(whole, window, g)
        loop = rejection_loop(_info(whole), *window, run=RUN)
        assert isinstance(loop, rejection.NormalRejection)
        assert loop.serial == ((n < 16),) * 2
        assert torch.equal(loop.end(start, 2), want)
        for s, e in [(0, n), (n // 2, n), (n - 1, n)]:
            part = torch.empty(e - s, dtype=dtype)
            loop.rows(s, e, part, lambda w: mt19937.advance(start, w), 2)
            assert torch.equal(part, whole[s:e]), (window, s, e)


def test_strided_loops_give_no_rows_and_overlapping_ones_are_run():
    t = torch.empty(20, 8).t()
    normal = rejection_loop(_info(t), *NORMAL[0], run=RUN)
    uniform = rejection_loop(_info(t), *UNIFORM[0], run=RUN)
    assert isinstance(uniform, uniform_rejection.UniformRejection)
    state = torch.Generator().manual_seed(0).get_state()
    for loop in (normal, uniform):
        assert loop.rows(0, 4, torch.empty(4), lambda w: mt19937.advance(state, w)) is None
    overlapping = TensorInfo((8, 8), (1, 1), torch.float32)
    assert rejection_loop(overlapping, *NORMAL[0], run=RUN) is None
    # Without torch's function to check against, the cached-normal path is not taken.
    assert rejection_loop(TensorInfo((5,), (1,), torch.float32), *NORMAL[0]) is None


INITS = {
    "small": lambda w: nn.init.trunc_normal_(w[0, :5], mean=0.1, std=1.0, a=-1.0, b=1.2),
    "transposed": lambda w: nn.init.trunc_normal_(w.t(), mean=0.1, std=1.0, a=-1.0, b=1.2),
    "columns": lambda w: nn.init.trunc_normal_(w[:, ::2], mean=0.1, std=1.0, a=-1.0, b=1.2),
    "unreachable-strided": lambda w: nn.init.trunc_normal_(w.t(), std=0.02),
    "uniform-strided": lambda w: nn.init.trunc_normal_(w[:, 1::3], std=1.0, a=-0.4, b=0.4),
}


@pytest.mark.parametrize("order", ["forward", "reverse", "partial"])
@pytest.mark.parametrize("init", INITS.values(), ids=INITS.keys())
def test_deferred_calls_match_eager_in_any_order(init, order):
    def program(defer):
        def build():
            a, b = torch.zeros(20, 8), torch.zeros(6, 4)  # parts are left as made
            init(a)
            nn.init.normal_(b[:, :3])  # a cached-normal op after the loop: placed from its end
            return a, b, torch.randn(7)

        return defer(build)

    orders = {"forward": [0, 1, 2], "reverse": [2, 1, 0], "partial": [2, 0]}
    check_program(program, order=orders[order])


@pytest.mark.parametrize("init", INITS.values(), ids=INITS.keys())
def test_deferring_steps_the_loop_and_runs_nothing_whole(init, monkeypatch):
    def never(self, node, state):
        raise AssertionError(f"{node.name} was run whole into scratch")

    monkeypatch.setattr(RngReplay, "run_into_scratch", never)
    torch.manual_seed(3)
    w = torch.empty(20, 8)
    init(w)
    eager = torch.default_generator.get_state()
    torch.manual_seed(3)
    torchdefer.deferred_init(lambda: init(torch.empty(20, 8)))
    assert torch.equal(torch.default_generator.get_state(), eager)


def test_a_cached_normal_op_after_a_stepped_loop_is_placed_not_run(monkeypatch):
    # Whether the loop's end holds a cached sample is read from that end.
    def never(self, node, state):
        raise AssertionError(f"{node.name} was run whole into scratch")

    monkeypatch.setattr(RngReplay, "run_into_scratch", never)

    def program(defer):
        def build():
            a, b = torch.zeros(20, 8), torch.zeros(6, 4)
            nn.init.trunc_normal_(a.t(), mean=0.1, std=1.0, a=-1.0, b=1.2)
            nn.init.normal_(b[:, :3])  # cached normals: 12 strided elements
            nn.init.normal_(b[0, :3])  # and 3 more, after an even count or an odd one
            return a, b, torch.randn(5)

        return defer(build)

    check_program(program, order=[2, 1, 0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("window", NORMAL + UNIFORM)
def test_under_16_elements_the_end_is_torchs_loop_on_as_many_contiguous_ones(
    dtype, cached, window
):
    from torchdefer.recorder._trunc_normal import rejection_end

    views = [lambda e: e(15, 3)[:, 1], lambda e: e(2, 7).t(), lambda e: e(1),
             lambda e: e(4, 9)[::2, ::3]]  # fmt: skip
    for k, view in enumerate(views):
        t = view(lambda *size: torch.empty(*size, dtype=dtype))
        g = _start(k, cached)
        start = g.get_state()
        want = _eager_end(t, window, g)
        assert torch.equal(rejection_end(start, _info(t), *window, run=RUN), want)
