"""trunc_normal_'s uniform loop (p <= 0.3), stepped in chunks, ends where torch's own loop
leaves the generator, and a range drawn alone has eager's values."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from parity import trunc_normal_reads_data
from torchdefer.recorder._trunc_normal import _mass, _uniform_words, rejection_end, rejection_loop
from torchdefer.rng import _uniform_rejection as uniform_rejection
from torchdefer.rng import mt19937
from torchdefer.rng.draws import TensorInfo

pytestmark = pytest.mark.skipif(
    not trunc_normal_reads_data(), reason="trunc_normal_ is a rejection loop since torch 2.12"
)

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# Sizes around vector widths (8, 16, 32, 64 elements), 1 and 0.
SIZES = (0, 1, 3, 17, 33, 129, 1000)
# (mean, std, a, b), p <= 0.3: a centred window, one beside the mean, one far from it.
WINDOWS = ((0.0, 1.0, -0.3, 0.3), (0.1, 0.02, 0.115, 0.2), (2.0, 1.0, -0.5, 0.5))


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    saved = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(saved)


def _eager(n, dtype, window, seed):
    """torch's own loop on ``n`` elements: (its start state, values, end state)."""
    g = torch.Generator().manual_seed(seed)
    start = g.get_state()
    w = torch.empty(n, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 'mean is more than 2 std from [a, b]'
        nn.init.trunc_normal_(w, *window, generator=g)
    return start, w, g.get_state()


def _loop(n, dtype, window):
    info = TensorInfo((n,), (1,), dtype)
    loop = rejection_loop(info, *window, run=nn.init._no_grad_trunc_normal_)
    assert isinstance(loop, uniform_rejection.UniformRejection)
    return loop


def test_the_windows_take_the_uniform_branch():
    assert all(_mass(*w) <= 0.3 for w in WINDOWS)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_premises_hold_on_this_torch(dtype):
    run = nn.init._no_grad_trunc_normal_
    assert uniform_rejection.premises_hold(dtype, run, _uniform_words(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_the_chunked_loop_ends_where_trunc_normal_leaves_the_generator(dtype, n, threads):
    for seed, window in enumerate(WINDOWS):
        start, _, end = _eager(n, dtype, window, seed)
        loop = _loop(n, dtype, window)
        for chunk in (None, 48):
            assert torch.equal(loop.end(start, chunk), end), (window, chunk)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES[1:])
def test_any_range_of_the_loop_drawn_alone_is_eagers(dtype, n, threads):
    window = WINDOWS[n % len(WINDOWS)]
    start, whole, _ = _eager(n, dtype, window, n)
    loop = _loop(n, dtype, window)
    for s, e in [(0, n), (1, n // 2 + 1), (n // 3, n), (n - 1, n)]:
        part = torch.empty(e - s, dtype=dtype)
        drawn = loop.rows(s, e, part, lambda w: mt19937.advance(start, w), 64)
        assert torch.equal(part, whole[s:e]), (s, e)
        assert drawn >= 2 * (e - s)  # a candidate and an acceptance uniform each, per round


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(0, 300),
    seed=st.integers(0, 2**31),
    mean=st.floats(-2, 2),
    std=st.floats(0.01, 3),
    left=st.floats(-2.5, 2.5),
    width=st.floats(0.0, 0.7),
    dtype=st.sampled_from(DTYPES),
)
def test_random_windows_end_and_draw_as_eager(n, seed, mean, std, left, width, dtype):
    window = (mean, std, mean + left * std, mean + (left + width) * std)
    if _mass(*window) > 0.3 or _mass(*window) < 1e-3:  # the normal_ branch; or endless
        return
    start, whole, end = _eager(n, dtype, window, seed)
    loop = _loop(n, dtype, window)
    assert torch.equal(loop.end(start, 64), end)
    part = torch.empty(n, dtype=dtype)
    loop.rows(0, n, part, lambda w: mt19937.advance(start, w), 64)
    assert torch.equal(part, whole)


def test_a_decision_the_paths_round_differently_is_not_guessed(monkeypatch):
    # Should a scalar loop round log(u) to the other side of the test, neither
    # path's answer is known to be eager's: the loop is not stepped.
    original = uniform_rejection._scalar

    def other_log(values, op):
        out = original(values, op)
        return out.fill_(float("inf")) if op is torch.Tensor.log_ else out

    monkeypatch.setattr(uniform_rejection, "_scalar", other_log)
    start, _, _ = _eager(50, torch.float32, WINDOWS[0], 0)
    loop = _loop(50, torch.float32, WINDOWS[0])
    assert loop.end(start) is None
    assert loop.rows(0, 50, torch.empty(50), lambda w: mt19937.advance(start, w)) is None


def test_a_density_the_loops_round_differently_after_any_op_is_not_guessed(monkeypatch):
    # Eager may take the vectorized loop in one op and the scalar one in the
    # next: the two must agree after every op, not only at the end.
    original = uniform_rejection._scalar_copy

    def one_ulp_off(values):
        out = original(values)
        return out.copy_(torch.nextafter(out, torch.full_like(out, float("inf"))))

    monkeypatch.setattr(uniform_rejection, "_scalar_copy", one_ulp_off)
    start, _, _ = _eager(50, torch.float32, WINDOWS[0], 0)
    assert _loop(50, torch.float32, WINDOWS[0]).end(start) is None


def test_only_non_overlapping_finite_calls_with_torchs_function_are_stepped():
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    run = nn.init._no_grad_trunc_normal_
    flat = TensorInfo((64,), (1,), torch.float32)
    assert rejection_end(state, flat, 0.0, 1.0, -0.2, 0.2, run=run) is not None
    assert rejection_end(state, flat, 0.0, 1.0, -0.2, 0.2) is None  # nothing to check against
    transposed = TensorInfo((8, 8), (1, 8), torch.float32)  # stepped in its memory order
    run(torch.empty(8, 8).t(), 0.0, 1.0, -0.2, 0.2, generator=g)
    assert torch.equal(rejection_end(state, transposed, 0.0, 1.0, -0.2, 0.2, run=run), g.get_state())
    overlapping = TensorInfo((8, 8), (1, 1), torch.float32)
    assert rejection_end(state, overlapping, 0.0, 1.0, -0.2, 0.2, run=run) is None
    assert rejection_end(state, flat, 0.0, 1.0, float("-inf"), -9.0, run=run) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_loop_over_more_than_a_chunk_ends_where_eager_does(dtype, threads):
    n = uniform_rejection.CHUNK + 40_003  # a whole chunk, then a padded one past the grain
    start, whole, end = _eager(n, dtype, WINDOWS[0], 3)
    loop = _loop(n, dtype, WINDOWS[0])
    assert torch.equal(loop.end(start), end)
    part = torch.empty(50_000, dtype=dtype)
    loop.rows(n - 50_000, n, part, lambda w: mt19937.advance(start, w))
    assert torch.equal(part, whole[n - 50_000 :])


@pytest.mark.parametrize("k", [1, 127, 129, 32_640, 32_641, 100_000, uniform_rejection.CHUNK])
def test_every_thread_gets_whole_vector_steps_of_a_padded_buffer(k):
    # at::parallel_for's two backends (OpenMP, native), for any thread count.
    m = uniform_rejection._padded(k)
    assert m >= k
    grain = uniform_rejection._GRAIN
    for threads in range(1, 65):
        if m < grain:
            pieces = [m]
        else:
            openmp = -(-m // min(threads, -(-m // grain)))
            native = max(grain, -(-m // threads))
            pieces = [openmp, native]
        assert all(p % 128 == 0 or p >= m for p in pieces), (threads, pieces)
