"""The proof that normal_ cannot leave [mean - limit*std, mean + limit*std], checked on this torch."""

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity import trunc_normal_reads_data
from torchdefer.rng import _bounds as bounds

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# Bits of a uniform rounded to the dtype (its significand with the implicit one).
_DTYPE_DIGITS = {torch.float16: 11, torch.bfloat16: 8}


def _uniforms_in_dtype(dtype) -> bool:
    """torch 2.8's float16/bfloat16 fill path rounds its uniforms to the dtype, so ``|z|``
    stops at sqrt(-2 ln 2**-digits) (3.90 and 3.33 sigma) instead of float32's 5.77.
    Only before 2.12, where ``trunc_normal_`` has no rejection loop and nothing uses
    the proof; the proof then refuses those dtypes (its premises do not hold)."""
    if dtype not in _DTYPE_DIGITS or trunc_normal_reads_data():
        return False
    largest = max(bounds._extreme_z(dtype, p) for p in bounds._PATTERNS)
    limit = math.sqrt(2 * _DTYPE_DIGITS[dtype] * math.log(2))
    return abs(largest - limit) <= 2 * torch.finfo(dtype).eps * limit


def test_crafted_states_give_python_mt19937_the_chosen_words():
    # Python's random is mt19937 with the same tempering: an independent check of _untemper.
    words = [0, 0xFFFFFFFF, 0x12345678, 0x9ABCDEF0, 7]
    state = bounds._state_with_next_words(words)
    array = bounds.mt19937.array_of(state).tolist()
    python = random.Random()
    python.setstate((3, (*array, 1), None))  # index 1: array[0] counts as drawn
    assert [python.getrandbits(32) for _ in words] == words


@pytest.mark.parametrize("dtype", FLOATS)
def test_the_premises_hold_on_this_torch(dtype):
    if _uniforms_in_dtype(dtype):
        assert not bounds.premises_hold(dtype)
        assert bounds.normal_limit(dtype, 4096, True) is None, "a limit without its premises"
        return
    assert bounds.premises_hold(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_the_extreme_uniforms_reach_the_computed_limit_and_no_further(dtype):
    largest = max(bounds._extreme_z(dtype, p) for p in bounds._PATTERNS)
    digits = 53 if dtype == torch.float64 else 24
    if _uniforms_in_dtype(dtype):
        digits = _DTYPE_DIGITS[dtype]
    limit = math.sqrt(2 * digits * math.log(2))  # sqrt(-2 ln 2**-digits)
    assert largest <= limit * (1 + 2 * torch.finfo(dtype).eps)
    assert largest >= limit * (1 - 2 * torch.finfo(dtype).eps)
    if not _uniforms_in_dtype(dtype):
        assert largest <= bounds.normal_limit(dtype, 16, True)


def test_cached_normal_paths_and_other_dtypes_are_not_proven():
    assert bounds.normal_limit(torch.float32, 15, True) is None  # serial: a cached normal
    assert bounds.normal_limit(torch.float32, 64, False) is None
    assert bounds.normal_limit(torch.int64, 64, True) is None
    assert bounds.normal_limit(torch.complex64, 64, True) is None


def test_the_limit_covers_both_devices_kernels():
    # CUDA's curand Box-Muller reaches further than the CPU fill path (2**-33 vs 2**-24).
    assert bounds.normal_limit(torch.float32, 64, True) >= bounds.z_limit(2.0**-33)
    assert bounds.normal_limit(torch.float64, 64, True) >= bounds.z_limit(2.0**-54)


def test_default_torchtitan_bounds_are_never_reached_and_three_sigma_ones_are():
    for dtype in FLOATS:
        # not proven where the premises fail (2.8's float16/bfloat16, before the loop existed)
        proven = not _uniforms_in_dtype(dtype)
        assert bounds.never_leaves(dtype, 4096, True, 0.0, 0.02, -2.0, 2.0) == proven
        assert not bounds.never_leaves(dtype, 4096, True, 0.0, 0.02, -0.06, 0.06)
    assert bounds.never_leaves(torch.float32, 64, True, 0.0, 1.0, -math.inf, math.inf)


def test_degenerate_arguments_are_not_proven():
    f = torch.float32
    assert not bounds.never_leaves(f, 64, True, 0.0, math.inf, -2.0, 2.0)
    assert not bounds.never_leaves(f, 64, True, math.nan, 0.02, -2.0, 2.0)
    assert not bounds.never_leaves(f, 64, True, 0.0, 0.02, math.nan, 2.0)
    assert not bounds.never_leaves(f, 64, True, 0.0, -0.02, -2.0, 2.0)
    # mean + limit*std overflows float16 although the bounds are infinite
    assert not bounds.never_leaves(torch.float16, 64, True, 0.0, 60000.0, -math.inf, math.inf)


def _extreme_values(dtype, mean, std):
    """normal_(mean, std) of 16 elements from the crafted extreme states: min and max."""
    lo, hi = math.inf, -math.inf
    per = 2 if dtype == torch.float64 else 1
    for first, second in (*bounds._PATTERNS, (0, 0x80000000), (0xFFFFFFFF, 0x80000000)):
        g = torch.Generator().manual_seed(0)
        g.set_state(bounds._state_with_next_words([first] * 8 * per + [second] * 8 * per))
        out = torch.empty(16, dtype=dtype).normal_(mean, std, generator=g).double()
        lo, hi = min(lo, out.min().item()), max(hi, out.max().item())
    return lo, hi


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(FLOATS),
    mean=st.floats(-3, 3),
    std=st.floats(1e-3, 2),
    sigmas=st.floats(5.0, 9.5),
)
def test_whatever_is_proven_holds_at_the_kernels_extremes(dtype, mean, std, sigmas):
    # Bounds near the proof's edge: if proven, the real kernel's extreme values stay inside.
    lo = torch.tensor(mean - sigmas * std, dtype=torch.float64).to(dtype).item()
    hi = torch.tensor(mean + sigmas * std, dtype=torch.float64).to(dtype).item()
    if not bounds.never_leaves(dtype, 16, True, mean, std, lo, hi):
        return
    got_lo, got_hi = _extreme_values(dtype, mean, std)
    assert lo <= got_lo and got_hi <= hi


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
       st.sampled_from(FLOATS))
def test_in_dtype_is_torchs_cast(x, dtype):
    want = torch.tensor(x, dtype=dtype).item()
    got = bounds.in_dtype(x, dtype)
    assert got == want or (math.isnan(got) and math.isnan(want))
    assert math.copysign(1.0, got) == math.copysign(1.0, want)


@pytest.mark.parametrize("x", [3.4028235677973366e38, 3.402823669209385e38, 3.4028236e38, 1e39,
                               -1e39, 1.4e-45, 7e-46, 1e-50, -0.0])
def test_in_dtype_rounds_at_float32s_edges_as_torch(x):
    assert bounds.in_dtype(x, torch.float32) == torch.tensor(x, dtype=torch.float32).item()
