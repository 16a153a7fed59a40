"""How far from its mean ``normal_`` can land: the proof that a rejection loop never rejects.

Since torch 2.12, ``nn.init.trunc_normal_`` draws ``normal_(mean, std)`` and
redraws while any value lies outside ``[a, b]``. Its usual bounds (torchtitan:
``std=0.02, a=-2, b=2``, 100 sigma) are never reached, because the kernels
make normals by Box-Muller from uniforms of finite resolution: the radius
``sqrt(-2 log u)`` is largest at the smallest ``u`` a kernel can form, and no
angle makes ``|cos|`` or ``|sin|`` exceed 1. Per kernel:

* **CPU, 16 or more contiguous elements** (``normal_fill``,
  ``aten/src/ATen/native/cpu/DistributionTemplates.h``): uniforms
  ``at::uniform_real_distribution<opmath_t>``, i.e. ``k * 2**-digits`` with the
  opmath type's mantissa digits (24 for float32, float16 and bfloat16, whose
  opmath is float; 53 for float64, from two words), and ``u1 = 1 - u`` in
  ``(0, 1]``: ``u1 >= 2**-24`` gives ``|z| <= sqrt(48 ln 2) = 5.77``;
  ``2**-53`` gives ``sqrt(106 ln 2) = 8.57``. Vectorized (AVX2) and scalar
  ``NormalFill16`` use the same uniforms.
* **CPU, fewer than 16 or non-contiguous** (``at::normal_distribution<double>``):
  53-bit uniforms and ``log1p(-u)``, 8.57, *but* the first sample may be the
  generator's cached normal, which ``Generator.set_state`` can make anything:
  this path is not proven (the call is run).
* **CUDA** (``curand_normal4`` / ``curand_normal2_double`` of Philox, used by
  ``normal_kernel`` in ``aten/src/ATen/native/cuda/DistributionTemplates.h``):
  ``u = x * 2**-32 + 2**-33`` (float, 6.76) and ``zx * 2**-53 + 2**-54``
  (double, 8.65). A tensor recorded on one device may be replayed on the
  other, so both limits apply to every call.

A relative margin covers approximate ``log``/``sin``/``cos`` (``avx_mathfun``,
``__logf``); the scaled value ``mean + std * z`` is rounded to the opmath type
and then to the dtype, both monotone, so it stays within the bounds widened by
two units in the dtype's last place (and the smallest normal, for rounding near
zero). :func:`never_leaves` says when every value a call can produce lies in
``[lo, hi]``.

The reading of the CPU kernels is not trusted blindly: :func:`premises_hold`
runs the installed torch's ``normal_`` from crafted mt19937 states whose next
words are the extreme uniforms (every bit set, and none) and requires the
largest ``|z|`` it returns to be the limit computed here; the CUDA kernels
cannot run on a CPU host and are taken from the source.
"""

from __future__ import annotations

import functools
import math
import struct
import sys

import torch

from torchdefer.rng import draws, mt19937

__all__ = [
    "BLOCK", "RELATIVE_MARGIN", "cuda_limit", "in_dtype", "never_leaves", "normal_limit",
    "premises_hold", "z_limit",
]

# Generous: float log/sin/cos approximations are within a few ulp (1e-7).
RELATIVE_MARGIN = 1e-4
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
BLOCK = 16  # the CPU fill path's Box-Muller block: from this size on, one limit


def z_limit(smallest_uniform: float) -> float:
    """The Box-Muller radius at the smallest uniform a kernel forms (no margin)."""
    return math.sqrt(-2.0 * math.log(smallest_uniform))


def _opmath_digits(dtype: torch.dtype) -> int:
    return 53 if dtype == torch.float64 else 24


def _cpu_fill_limit(dtype: torch.dtype) -> float:
    return z_limit(2.0 ** -_opmath_digits(dtype))


def cuda_limit(dtype: torch.dtype) -> float:
    """The largest ``|z|`` the CUDA kernels' uniforms allow (read from their source)."""
    return z_limit(2.0**-54 if dtype == torch.float64 else 2.0**-33)


def normal_limit(dtype: torch.dtype, numel: int, contiguous: bool) -> float | None:
    """The largest ``|z|`` (margin included) ``normal_`` can give such a tensor on any device.

    None where no bound is proven: the CPU cached-normal path (fewer than 16
    or non-contiguous elements), dtypes other than the four floating ones, or
    a torch whose kernels do not behave as read here (:func:`premises_hold`).
    """
    if dtype not in _FLOATS or numel < BLOCK or not contiguous or not premises_hold(dtype):
        return None
    return max(_cpu_fill_limit(dtype), cuda_limit(dtype)) * (1 + RELATIVE_MARGIN)


def never_leaves(
    dtype: torch.dtype, numel: int, contiguous: bool, mean: float, std: float, lo: float, hi: float
) -> bool:
    """Whether every value ``normal_(mean, std)`` can write into such a tensor is in ``[lo, hi]``.

    ``lo``/``hi`` are compared with the values as the tensor's dtype holds them.

    >>> import torch
    >>> never_leaves(torch.float32, 4096, True, 0.0, 0.02, -2.0, 2.0)
    True
    >>> never_leaves(torch.float32, 4096, True, 0.0, 0.02, -0.06, 0.06)  # 3 sigma
    False
    """
    limit = normal_limit(dtype, numel, contiguous)
    if limit is None or math.isnan(lo) or math.isnan(hi):
        return False
    # The kernels scale in opmath (float32, or float64) after casting mean and std to it.
    pairs = [(mean, in_dtype(mean, torch.float32)), (std, in_dtype(std, torch.float32))]
    if not all(math.isfinite(x) for pair in pairs for x in pair) or std < 0:
        return False
    reach = max(pairs[1]) * limit
    top, bottom = max(pairs[0]) + reach, min(pairs[0]) - reach
    finfo = torch.finfo(dtype)
    # Two units in the dtype's last place for the roundings to opmath and to the
    # dtype, the smallest normal for those near zero, and a few of float64's
    # for computing top and bottom here in floats.
    arithmetic = 8 * sys.float_info.epsilon * (max(map(abs, pairs[0])) + reach + 1.0)
    top += abs(top) * 2 * finfo.eps + finfo.tiny + arithmetic
    bottom -= abs(bottom) * 2 * finfo.eps + finfo.tiny + arithmetic
    if top > finfo.max or bottom < -finfo.max:
        return False  # could round to infinity
    return top <= hi and bottom >= lo


def in_dtype(x: float, dtype: torch.dtype) -> float:
    """``x`` as ``dtype`` holds it (``tensor.new_tensor(x).item()``; inf past its range)."""
    if dtype == torch.float64:
        return float(x)
    if dtype == torch.float32:  # C's (float) cast, as torch's; no tensor op (~5 µs)
        try:
            return _FLOAT32.unpack(_FLOAT32.pack(x))[0]  # type: ignore[no-any-return]
        except OverflowError:  # beyond float32's range: torch's cast gives inf
            return math.copysign(math.inf, x)
    return _in_dtype(x, dtype)


_FLOAT32 = struct.Struct("<f")


@functools.lru_cache(maxsize=1024)  # a model repeats a few bounds, means and stds
def _in_dtype(x: float, dtype: torch.dtype) -> float:
    return torch.tensor(x, dtype=dtype, device="cpu").item()


# ------------------------------------------------------------- premises


@functools.cache
def premises_hold(dtype: torch.dtype) -> bool:
    """Whether this torch's CPU ``normal_`` fill path behaves as the proof reads it.

    Checks, for ``dtype``: 16 contiguous elements take the fill path (uniforms
    only, no cached normal, per the measured draw model), and from crafted
    states whose uniforms are the extreme ones the largest ``|z|`` returned is
    the computed limit (so the uniforms have the resolution read here).
    """
    if not mt19937.layout_known():
        return False
    drawn = draws.TensorInfo((BLOCK,), (1,), dtype)
    effect = draws.effect(torch.ops.aten.normal_.default, (drawn, 0.0, 1.0), {}, drawn)
    per_uniform = 2 if dtype == torch.float64 else 1
    if effect is None or effect.normals or effect.words != BLOCK * per_uniform:
        return False
    largest = max(_extreme_z(dtype, pattern) for pattern in _PATTERNS)
    limit = _cpu_fill_limit(dtype)
    # bfloat16/float16 round the result: compare at the dtype's precision.
    tolerance = limit * max(RELATIVE_MARGIN, 2 * torch.finfo(dtype).eps)
    return abs(largest - limit) <= tolerance


# The words of the first half (u1 of the 8 pairs) and of the second half (u2):
# every bit set or none. u1 = 1 - u is smallest when u has every bit set; an
# angle of 0 gives cos = 1. Both orders are tried, in case a kernel swaps them.
_PATTERNS = ((0xFFFFFFFF, 0), (0, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF))


def _extreme_z(dtype: torch.dtype, pattern: tuple[int, int]) -> float:
    """The largest ``|value|`` of ``normal_(0, 1)`` on 16 elements from a crafted state."""
    per_uniform = 2 if dtype == torch.float64 else 1
    half = 8 * per_uniform
    words = [pattern[0]] * half + [pattern[1]] * half
    generator = torch.Generator(device="cpu")
    generator.set_state(_state_with_next_words(words))
    out = torch.empty(BLOCK, dtype=dtype, device="cpu")
    out.normal_(0.0, 1.0, generator=generator)
    return float(out.abs().max().to(torch.float64))


def _state_with_next_words(words: list[int]) -> torch.Tensor:
    """A CPU generator state whose next outputs are ``words`` (32 bits each)."""
    base = torch.Generator(device="cpu").manual_seed(0).get_state()
    array = mt19937.array_of(base).clone()
    # One word counted as drawn (a state must have 1 to 624 left): the next is array[1].
    untempered = [_untemper(w) for w in words]
    array[1 : 1 + len(words)] = torch.tensor(untempered, dtype=torch.int64, device="cpu")
    return mt19937.with_engine(base, array, 1)


def _untemper(y: int) -> int:
    """The mt19937 state word whose tempered output is ``y``."""
    y ^= y >> 18
    y ^= (y << 15) & 0xEFC60000
    x = y
    for _ in range(5):  # y ^= (y << 7) & mask, undone 7 bits at a time
        x = y ^ ((x << 7) & 0x9D2C5680)
    y = x & 0xFFFFFFFF
    x = y
    for _ in range(3):  # y ^= y >> 11, undone 11 bits at a time
        x = y ^ (x >> 11)
    return x & 0xFFFFFFFF
