"""``nn.init.trunc_normal_`` whose bounds no value can reach: recorded as its one ``normal_``.

torch >= 2.12 draws ``normal_(mean, std)`` and redraws while a value lies
outside ``[a, b]`` (cast to the tensor's dtype). When ``rng._bounds`` proves
that no value ``normal_`` can produce leaves ``[a, b]``, the loop draws exactly
once, and the call *is* that ``normal_``: recorded as it, it is in the draw
model, reached by jump-ahead, sliced by rows, skipped when overwritten, and
never run while deferring. Every other call stays a composite, whose draws
are stepped in bounded memory where :func:`rejection_loop` knows the loop
(``rng._rejection``, ``rng._uniform_rejection``), else run to learn how far it
moves the generator.

What this module assumes of torch's function is checked on the installed torch
once per process (:func:`_draws_one_normal`): with unreachable bounds it gives
the values and the generator state of one plain ``normal_``. torch 2.8's
op-by-op ``trunc_normal_`` reads no data and is never wrapped at all.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from torchdefer.recorder._mode import suspended
from torchdefer.rng import _bounds as bounds
from torchdefer.rng import _rejection as rejection
from torchdefer.rng import _uniform_rejection as uniform_rejection
from torchdefer.rng import draws, mt19937

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
    # The limit depends on the size only through the 16-element block of the
    # fill path (bounds.normal_limit): larger sizes share one answer.
    block = min(info.numel(), bounds.BLOCK)
    return _proven(fn, meta.dtype, block, info.is_contiguous(), mean, std, a, b)


@functools.lru_cache(maxsize=4096)  # a model repeats a few stds many times
def _proven(fn, dtype, numel, contiguous, mean, std, a, b) -> bool:
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
    stepped exactly (``rng._rejection``, ``rng._uniform_rejection``); None: run it.

    Covers both branches (``normal_`` for ``p > 0.3``, uniforms for ``p <= 0.3``)
    on any number of elements laid out without overlap, contiguous or strided
    (taken in their TensorIterator order); each kind of call is checked once
    per dtype against ``run`` (torch's function), without which only the
    ``normal_`` branch on 16 or more contiguous elements is given.
    """
    if not all(isinstance(x, _NUMBER) and not isinstance(x, bool) for x in (mean, std, a, b)):
        return None
    mean, std, a, b = float(mean), float(std), float(a), float(b)
    if not (std > 0 and math.isfinite(std) and math.isfinite(mean)):
        return None
    if math.isnan(a) or math.isnan(b):
        return None
    dtype, n = tensor.dtype, tensor.numel()
    order = _draw_order(tensor)
    if dtype not in _DTYPES or order is None:
        return None
    in_order, row_major = order
    if _mass(mean, std, a, b) <= 0.3:
        return _uniform_loop(n, dtype, mean, std, a, b, run, in_order)
    loop = _normal_loop(n, dtype, mean, std, a, b, in_order, row_major)
    if loop is None:
        return None
    if not all(loop.serial):  # a round on the fill path
        if not rejection.chunks_match(dtype, _normal_words(dtype)) or not _rows_match(dtype):
            return None
    if any(loop.serial) and (run is None or not _serial_match(dtype, run)):
        return None
    return loop


def _normal_loop(n, dtype, mean, std, a, b, in_order, row_major):
    """The ``normal_`` branch's loop (its premises unchecked), or None."""
    serial = (n < 16 or not in_order, n < 16 or not row_major)
    fill = 0 if all(serial) else _normal_words(dtype)(n)
    if fill is None:
        return None
    lo, hi = bounds.in_dtype(a, dtype), bounds.in_dtype(b, dtype)  # as the loop casts them
    return rejection.NormalRejection(n, dtype, mean, std, lo, hi, fill, serial, in_order)


def _draw_order(tensor: draws.TensorInfo) -> tuple[bool, bool] | None:
    """(contiguous, dimensions in row-major order) of a tensor whose elements do not
    overlap (checked as its dimensions nest by stride), else None.

    TensorIterator draws into a tensor dimension by dimension, the smallest
    stride innermost; ``empty_like`` keeps that order (``infer_dense_strides``,
    the same rule), so every round of the loop takes its elements in one order:
    the elements' own (row-major) exactly when the strides fall along the dims.
    """
    dims = [(st, n) for n, st in zip(tensor.size, tensor.stride) if n != 1]
    if 0 in tensor.size:
        return True, True
    extent = 0  # the farthest element offset over the dims nested so far
    for stride, n in sorted(dims):
        if stride <= extent:
            return None  # overlapping, or too intricate to tell: run it
        extent += (n - 1) * stride
    strides = [st for st, _ in dims]
    return tensor.is_contiguous(), all(x > y for x, y in itertools.pairwise(strides))


def _uniform_loop(n, dtype, mean, std, a, b, run, in_order):
    """The uniform branch, where its premises hold on this torch (checked once per dtype)."""
    if run is None or not (math.isfinite(a) and math.isfinite(b) and a <= b):
        return None  # eager's uniform_ refuses infinite or reversed bounds: run it
    words = _uniform_words(dtype)
    if words(n) is None or not uniform_rejection.premises_hold(dtype, run, words):
        return None
    if not in_order and not _strided_uniform_match(dtype, run):
        return None
    return uniform_rejection.UniformRejection(n, dtype, mean, std, a, b, words(n), in_order)


def rejection_end(
    state: torch.Tensor, tensor: draws.TensorInfo, mean: Any, std: Any, a: Any, b: Any,
    generator: Any = None, *, run: Callable[..., Any] | None = None,
) -> torch.Tensor | None:
    """The CPU state after ``trunc_normal_(tensor, mean, std, a, b)`` from ``state``,
    learnt in bounded memory; None where that is not known to be exact (``run``:
    torch's function)."""
    loop = rejection_loop(tensor, mean, std, a, b, generator, run=run)
    if loop is None:
        return None
    if loop.n < 16 and run is not None:
        # Every round on the cached-normal (or the serial uniform) path, whatever
        # the layout: torch's own loop on as many contiguous elements ends where
        # the call does (checked: _serial_match), and costs less than stepping.
        private = torch.Generator(device="cpu")
        private.set_state(state)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager warned at the call already
            run(torch.empty(loop.n, dtype=loop.dtype, device="cpu"),
                float(mean), float(std), float(a), float(b), generator=private)  # fmt: skip
        return private.get_state()
    return loop.end(state)


@functools.cache
def _rows_match(dtype: torch.dtype) -> bool:
    """Whether parts of a loop drawn by ``NormalRejection.rows`` are eager's (checked once)."""
    for n in (50, 211):
        generator = torch.Generator(device="cpu").manual_seed(n)
        start = generator.get_state()
        whole = torch.empty(n, dtype=dtype, device="cpu")
        torch.nn.init.trunc_normal_(whole, 0.1, 1.0, -1.0, 1.2, generator=generator)
        lo, hi = bounds.in_dtype(-1.0, dtype), bounds.in_dtype(1.2, dtype)
        words = _normal_words(dtype)(n)
        if words is None:  # unmodeled at this size: no rows
            return False
        loop = rejection.NormalRejection(n, dtype, 0.1, 1.0, lo, hi, words)
        if not torch.equal(loop.end(start), generator.get_state()):
            return False
        for s, e in ((0, n), (3, 40), (17, n - 5), (n - 16, n)):
            part = torch.empty(e - s, dtype=dtype, device="cpu")
            loop.rows(s, e, part, functools.partial(mt19937.advance, start))
            if not torch.equal(part, whole[s:e]):
                return False
    return True


_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _layouts(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Small tensors of the layouts the loops step: under 16 elements, strided in
    row-major order, transposed (dense), and strided across the dims."""
    def fresh(*size: int) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device="cpu")

    return (
        fresh(1), fresh(5), fresh(15), fresh(6, 10)[:, ::2], fresh(8, 6).t(),
        fresh(10, 8).t()[:, ::2], fresh(3, 4, 5).permute(2, 0, 1)[1:],
    )


def _start(seed: int, cached: bool) -> torch.Generator:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    if cached:  # leaves a double normal cached, which the serial path takes first
        torch.empty(1, dtype=torch.float64, device="cpu").normal_(generator=generator)
    return generator


@functools.cache
def _serial_match(dtype: torch.dtype, run: Callable[..., Any]) -> bool:
    """Whether ``NormalRejection`` on the cached-normal path (small or strided tensors)
    ends where ``run`` (torch's function) does, with or without a cached sample, and
    its rows of a small tensor are eager's (checked once per dtype)."""
    for k, tensor in enumerate(_layouts(dtype)):
        for cached in (False, True):
            generator = _start(k, cached)
            start = generator.get_state()
            with torch.no_grad():
                run(tensor, 0.1, 1.0, -1.0, 1.2, generator=generator)
            info = draws.TensorInfo(tuple(tensor.shape), tensor.stride(), dtype)
            order = _draw_order(info)
            loop = None if order is None else _normal_loop(
                tensor.numel(), dtype, 0.1, 1.0, -1.0, 1.2, *order
            )
            if loop is None:
                return False
            if not torch.equal(loop.end(start, chunk=4), generator.get_state()):
                return False
            if loop.in_order:
                part = torch.empty(max(0, loop.n - 1), dtype=dtype, device="cpu")
                loop.rows(1, loop.n, part, functools.partial(mt19937.advance, start), 2)
                if not torch.equal(part, tensor.reshape(-1)[1:]):
                    return False
    return True


@functools.cache
def _strided_uniform_match(dtype: torch.dtype, run: Callable[..., Any]) -> bool:
    """Whether the uniform loop on strided tensors ends where ``run`` does (checked once)."""
    for k, tensor in enumerate(_layouts(dtype)[3:]):
        generator = _start(k, False)
        start = generator.get_state()
        with torch.no_grad():
            run(tensor, 0.0, 1.0, -0.3, 0.3, generator=generator)
        words = _uniform_words(dtype)(tensor.numel())
        loop = uniform_rejection.UniformRejection(
            tensor.numel(), dtype, 0.0, 1.0, -0.3, 0.3, words, False  # type: ignore[arg-type]
        )
        end = loop.end(start, chunk=8)
        if end is None or not torch.equal(end, generator.get_state()):
            return False
    return True


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
