"""``nn.init.trunc_normal_`` whose bounds no value can reach: recorded as its one ``normal_``.

torch >= 2.12 draws ``normal_(mean, std)`` and redraws while a value lies
outside ``[a, b]`` (cast to the tensor's dtype). When ``rng.bounds`` proves
that no value ``normal_`` can produce leaves ``[a, b]``, the loop draws exactly
once, and the call *is* that ``normal_``: recorded as it, it is in the draw
model, reached by jump-ahead, sliced by rows, skipped when overwritten, and
never run while deferring. Every other call stays a composite, whose draws
are stepped in bounded memory where :func:`rejection_loop` knows the loop
(``rng.rejection``, ``rng.uniform_rejection``), else run to learn how far it
moves the generator.

What this module assumes of torch's function is checked on the installed torch
once per process (:func:`_draws_one_normal`): with unreachable bounds it gives
the values and the generator state of one plain ``normal_``. torch 2.8's
op-by-op ``trunc_normal_`` reads no data and is never wrapped at all.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from torchdefer.rng import bounds, draws, mt19937, rejection, uniform_rejection

__all__ = ["one_normal", "rejection_end", "rejection_loop"]

_NUMBER = (int, float)


def one_normal(
    fn: Callable[..., Any], tensor: Any, mean: Any, std: Any, a: Any, b: Any
) -> bool:
    """Whether ``fn(tensor, mean, std, a, b)`` provably draws exactly one ``normal_``.

    ``tensor`` is deferred: only its metadata is read.
    """
    if not all(isinstance(x, _NUMBER) and not isinstance(x, bool) for x in (mean, std, a, b)):
        return False
    mean, std, a, b = float(mean), float(std), float(a), float(b)
    if not (std > 0 and math.isfinite(std) and math.isfinite(mean)):
        return False
    if math.isnan(a) or math.isnan(b):
        return False
    # The deferred tensor's recorded metadata: asking the tensor (tensor.numel())
    # would go through __torch_function__, ~0.1 ms a question.
    meta = tensor._value.meta
    if tensor.fake_device.type not in ("cpu", "cuda") or meta.dtype not in _DTYPES:
        return False
    # torch's own choice of branch and its warning, computed as it does.
    if (mean < a - 2 * std) or (mean > b + 2 * std) or _mass(mean, std, a, b) <= 0.3:
        return False
    info = draws.TensorInfo(meta.size, meta.stride, meta.dtype)
    return _proven(fn, meta.dtype, info.numel(), info.is_contiguous(), mean, std, a, b)


@functools.lru_cache(maxsize=4096)  # a model repeats a few shapes and stds many times
def _proven(fn, dtype, numel, contiguous, mean, std, a, b) -> bool:
    from torchdefer.recorder.mode import suspended

    with suspended():  # the checks below run real kernels (once per process)
        lo, hi = bounds.in_dtype(a, dtype), bounds.in_dtype(b, dtype)
        # Whether or not a torch casts the bounds, the tighter of the two holds;
        # one unit in the last place more, should its rounding differ from ours.
        lo, hi = _inward(max(a, lo), dtype, 1), _inward(min(b, hi), dtype, -1)
        if not bounds.never_leaves(dtype, numel, contiguous, mean, std, lo, hi):
            return False
        return _draws_one_normal(fn)


def rejection_loop(
    tensor: draws.TensorInfo, mean: Any, std: Any, a: Any, b: Any, generator: Any = None,
    *, run: Callable[..., Any] | None = None,
) -> rejection.NormalRejection | uniform_rejection.UniformRejection | None:
    """The rejection loop ``trunc_normal_`` runs on ``tensor``, where it is known to be
    stepped and sliced exactly (``rng.rejection``, ``rng.uniform_rejection``); None: run it.

    Covers the ``normal_`` branch (``p > 0.3``) on 16 or more contiguous
    elements, and the uniform branch (``p <= 0.3``) on contiguous elements of
    any number, when ``run`` (torch's function) is given to check it against.
    """
    if not all(isinstance(x, _NUMBER) and not isinstance(x, bool) for x in (mean, std, a, b)):
        return None
    mean, std, a, b = float(mean), float(std), float(a), float(b)
    if not (std > 0 and math.isfinite(std) and math.isfinite(mean)):
        return None
    if math.isnan(a) or math.isnan(b):
        return None
    dtype, n = tensor.dtype, tensor.numel()
    if dtype not in _DTYPES or not tensor.is_contiguous():
        return None
    if _mass(mean, std, a, b) <= 0.3:
        return _uniform_loop(n, dtype, mean, std, a, b, run)
    if n < 16:
        return None
    words = _normal_words(dtype)
    if words(n) is None or not rejection.chunks_match(dtype, words) or not _rows_match(dtype):
        return None
    lo, hi = bounds.in_dtype(a, dtype), bounds.in_dtype(b, dtype)  # as the loop casts them
    return rejection.NormalRejection(n, dtype, mean, std, lo, hi, words(n))


def _uniform_loop(n, dtype, mean, std, a, b, run) -> uniform_rejection.UniformRejection | None:
    """The uniform branch, where its premises hold on this torch (checked once per dtype)."""
    if run is None or not (math.isfinite(a) and math.isfinite(b) and a <= b):
        return None  # eager's uniform_ refuses infinite or reversed bounds: run it
    words = _uniform_words(dtype)
    if words(n) is None or not uniform_rejection.premises_hold(dtype, run, words):
        return None
    return uniform_rejection.UniformRejection(n, dtype, mean, std, a, b, words(n))


def rejection_end(state: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor | None:
    """The CPU state after ``trunc_normal_(*args, **kwargs)`` from ``state``, learnt in
    bounded memory; None where that is not known to be exact (``run=``: torch's function)."""
    loop = rejection_loop(*args, **kwargs)
    return None if loop is None else loop.end(state)


@functools.cache
def _rows_match(dtype: torch.dtype) -> bool:
    """Whether parts of a loop drawn by ``NormalRejection.rows`` are eager's (checked once)."""
    for n in (50, 211):
        generator = torch.Generator(device="cpu").manual_seed(n)
        start = generator.get_state()
        whole = torch.empty(n, dtype=dtype, device="cpu")
        torch.nn.init.trunc_normal_(whole, 0.1, 1.0, -1.0, 1.2, generator=generator)
        lo, hi = bounds.in_dtype(-1.0, dtype), bounds.in_dtype(1.2, dtype)
        loop = rejection.NormalRejection(n, dtype, 0.1, 1.0, lo, hi, _normal_words(dtype)(n))
        if not torch.equal(loop.end(start), generator.get_state()):
            return False
        for s, e in ((0, n), (3, 40), (17, n - 5), (n - 16, n)):
            part = torch.empty(e - s, dtype=dtype, device="cpu")
            loop.rows(s, e, part, lambda w, start=start: mt19937.advance(start, w))
            if not torch.equal(part, whole[s:e]):
                return False
    return True


_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@functools.cache
def _normal_words(dtype: torch.dtype) -> Callable[[int], int | None]:
    return _words_of(torch.ops.aten.normal_.default, dtype, (0.0, 1.0))


@functools.cache
def _uniform_words(dtype: torch.dtype) -> Callable[[int], int | None]:
    return _words_of(torch.ops.aten.uniform_.default, dtype, (0.0, 1.0))


def _words_of(op: Any, dtype: torch.dtype, scalars: tuple) -> Callable[[int], int | None]:
    """The draw model's words of ``op`` on ``n`` contiguous elements (no cached normals)."""
    def words(n: int) -> int | None:
        info = draws.TensorInfo((n,), (1,), dtype)
        effect = draws.effect(op, (info, *scalars), {}, info)
        return None if effect is None or effect.normals else effect.words

    return words


def _mass(mean: float, std: float, a: float, b: float) -> float:
    def norm_cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    return norm_cdf((b - mean) / std) - norm_cdf((a - mean) / std)


def _inward(x: float, dtype: torch.dtype, direction: int) -> float:
    if not math.isfinite(x):
        return x
    finfo = torch.finfo(dtype)
    return x + direction * (abs(x) * finfo.eps + finfo.tiny)


@functools.cache
def _draws_one_normal(fn: Callable[..., Any]) -> bool:
    """Whether this torch's ``fn`` with unreachable bounds is one ``normal_`` (checked once).

    Runs (with the recording suspended) on real CPU tensors and private
    generators, every tensor with its device and dtype named: the user's device
    context or default dtype at the first call must not decide the answer for
    the process.
    """
    with torch.no_grad():
        for dtype, n in ((torch.float32, 64), (torch.bfloat16, 50), (torch.float64, 40)):
            ran, plain = torch.Generator(device="cpu"), torch.Generator(device="cpu")
            ran.manual_seed(0x7EC)
            plain.manual_seed(0x7EC)
            got = torch.empty(n, dtype=dtype, device="cpu")
            want = torch.empty(n, dtype=dtype, device="cpu")
            result = fn(got, 0.25, 0.5, -1e4, 1e4, generator=ran)
            want.normal_(0.25, 0.5, generator=plain)
            if result is not got or not torch.equal(got, want):
                return False
            if not torch.equal(ran.get_state(), plain.get_state()):
                return False
    return True
