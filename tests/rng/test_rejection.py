"""Stepping a normal_ rejection loop in chunks ends where torch's own loop leaves the generator."""

import pytest
import torch
from torch import nn

from torchdefer.recorder._trunc_normal import _normal_words
from torchdefer.rng import rejection

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_round_drawn_in_chunks_is_a_whole_normal(dtype):
    assert rejection.chunks_match(dtype, _normal_words(dtype))


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
