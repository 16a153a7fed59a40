"""Stepping a normal_ rejection loop in chunks ends where torch's own loop leaves the generator."""

import pytest
import torch
from torch import nn

from parity import trunc_normal_reads_data
from torchdefer.recorder._trunc_normal import _normal_words
from torchdefer.rng import _rejection as rejection

# Compared with torch's own loop, which exists since torch 2.12 (before: erfinv of a uniform).
needs_loop = pytest.mark.skipif(
    not trunc_normal_reads_data(), reason="trunc_normal_ is a rejection loop since torch 2.12"
)

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_round_drawn_in_chunks_is_a_whole_normal(dtype):
    assert rejection.chunks_match(dtype, _normal_words(dtype))


@needs_loop
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [16, 37, 96, 1000, 4099])
@pytest.mark.parametrize("chunk", [16, 48, 1 << 18])
def test_the_chunked_loop_ends_where_trunc_normal_leaves_the_generator(dtype, n, chunk):
    for seed, (a, b) in enumerate([(-1.0, 1.0), (-2.5, 0.7), (-3.0, 3.0)]):
        g = torch.Generator().manual_seed(seed)
        start = g.get_state()
        t = torch.empty(n, dtype=dtype)
        nn.init.trunc_normal_(t, mean=0.1, std=1.0, a=a, b=b, generator=g)
        lo, hi = t.new_tensor(a).item(), t.new_tensor(b).item()
        words = _normal_words(dtype)(n)
        end = rejection.normal_rejection_end(start, n, dtype, 0.1, 1.0, lo, hi, words, chunk)
        assert torch.equal(end, g.get_state()), (seed, a, b)


@needs_loop
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_loop_premises_hold_on_this_torch(dtype):
    from torchdefer.recorder._trunc_normal import _rows_match

    assert _rows_match(dtype)


@needs_loop
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [16, 45, 160, 1001])
@pytest.mark.parametrize("chunk", [16, 64, None])
def test_any_range_of_a_loop_drawn_alone_is_eagers(dtype, n, chunk):
    g = torch.Generator().manual_seed(n)
    start = g.get_state()
    whole = torch.empty(n, dtype=dtype)
    nn.init.trunc_normal_(whole, mean=-0.2, std=1.0, a=-1.0, b=1.0, generator=g)
    lo, hi = whole.new_tensor(-1.0).item(), whole.new_tensor(1.0).item()
    loop = rejection.NormalRejection(n, dtype, -0.2, 1.0, lo, hi, _normal_words(dtype)(n))
    for s, e in [(0, n), (1, n // 2), (n // 3, n), (n - 1, n), (5, 6)]:
        part = torch.empty(e - s, dtype=dtype)
        drawn = loop.rows(s, e, part, lambda w: rejection.mt19937.advance(start, w), chunk)
        assert torch.equal(part, whole[s:e]), (s, e)
        assert drawn >= e - s
