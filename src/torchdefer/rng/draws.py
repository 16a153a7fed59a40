"""The draw model: how far each random op moves the CPU generator.

A random op on the CPU draws 32-bit words from mt19937 (``CPUGeneratorImpl``):
``uniform_`` one word an element (two for float64), ``normal_`` on 16 or more
contiguous elements one uniform an element plus 16 more when the count is not
a multiple of 16 (its Box-Muller blocks), smaller or strided ``normal_`` one
*cached* normal sample an element (a pair of normals costs four words and the
second is kept in the generator for the next call), ``bernoulli_`` with a
float ``p`` a single seed word on Intel CPUs with MKL and one a element
elsewhere, and so on (``aten/src/ATen/native/cpu/DistributionTemplates.h``).

Rather than trusting a table written from one version of those kernels, the
model is *measured* on the installed torch: for each class of call (the op,
its dtypes, the output's contiguity, the arguments that choose a code path)
the call is run on a few small sizes from a probe generator, the words drawn
are counted from the states before and after, and the class is accepted only
if one of the known shapes fits every size (``words = a * n + b``, the
Box-Muller fill, or cached normal samples). A class that fits none, and every
op without a rule here, is *unmodeled*: its position is reached by running it.

``effect(...)`` answers, for one recorded call, an :class:`Effect` or None.
Setting ``TORCHDEFER_RNG_JUMPS=0`` makes every op unmodeled: each random op
then runs after the one before it, which is slow but needs no model at all.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torchdefer._compat.generator import get_state
from torchdefer.errors import LookupKeyError, UsageError
from torchdefer.rng import mt19937

__all__ = [
    "NORMAL_BLOCKS",
    "TRUSTED_NAMESPACES",
    "Drawn",
    "Effect",
    "TensorInfo",
    "effect",
    "known_random_op",
    "may_draw_untagged",
    "schema_value",
    "words_between",
]


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """What the model reads of a tensor: sizes, strides, dtype (no tensor needed)."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    def numel(self) -> int:
        return math.prod(self.size)

    def element_size(self) -> int:
        return self.dtype.itemsize

    def is_contiguous(self) -> bool:
        """As ``Tensor.is_contiguous()``: row-major strides, size-1 dims ignored."""
        if 0 in self.size:
            return True
        expected = 1
        for n, st in zip(reversed(self.size), reversed(self.stride)):
            if n != 1 and st != expected:
                return False
            expected *= n
        return True


# What a random op writes to, as the models read it: a real, fake or meta
# tensor, or only its metadata.
Drawn = torch.Tensor | TensorInfo


@dataclass(frozen=True, slots=True)
class Effect:
    """What one call does to a CPU generator.

    ``normals`` samples of ``at::normal_distribution<double>`` (each takes the
    cached sample if there is one, else draws four words and caches the
    second normal of the pair), then ``words`` plain 32-bit draws.
    """

    words: int = 0
    normals: int = 0


_aten = torch.ops.aten
# Random ops PyTorch does not tag nondeterministic_seeded (random_ and its
# functional form): without this list they would be replayed as ordinary
# in-place ops, on whatever state the global generator has at replay.
_UNTAGGED_RANDOM = frozenset({_aten.random_, _aten.random})


def known_random_op(func: Any) -> bool:
    """Whether ``func`` draws from a generator (tagged, or known to be untagged)."""
    return torch.Tag.nondeterministic_seeded in func.tags or func.overloadpacket in _UNTAGGED_RANDOM


# PyTorch's own namespaces tag their random ops; other libraries' ops may
# draw from a default generator without saying so.
TRUSTED_NAMESPACES = frozenset({"aten", "prims", "prim"})


def may_draw_untagged(func: Any) -> bool:
    """Whether ``func`` comes from a library whose untagged ops may still draw."""
    return getattr(func, "namespace", "aten") not in TRUSTED_NAMESPACES


# Families of ops whose draws follow one shape. The float arguments named in
# `_PATH_FREE` never choose a code path, so calls that differ only in them
# share one measured class (kaiming bounds differ per layer).
# Normals made in Box-Muller blocks of 16 (a serial pair below 16 elements).
NORMAL_BLOCKS = frozenset({_aten.normal_, _aten.normal, _aten.randn, _aten.randn_like})
_SERIAL_NORMAL = frozenset({_aten.log_normal_, _aten.log_normal})
_LINEAR = frozenset(
    {
        _aten.uniform_, _aten.uniform, _aten.rand, _aten.rand_like,
        _aten.random_, _aten.random, _aten.randint, _aten.randint_like,
        _aten.bernoulli_, _aten.bernoulli, _aten.native_dropout,
        _aten.exponential_, _aten.exponential, _aten.geometric_, _aten.geometric,
        _aten.cauchy_, _aten.cauchy, _aten.randperm,
    }
)  # fmt: skip
_PATH_FREE = {
    _aten.normal_: ("mean", "std"), _aten.normal: ("mean", "std"),
    _aten.uniform_: ("from", "to"), _aten.uniform: ("from", "to"),
    _aten.log_normal_: ("mean", "std"), _aten.log_normal: ("mean", "std"),
    _aten.cauchy_: ("median", "sigma"), _aten.cauchy: ("median", "sigma"),
}  # fmt: skip
_RANDPERM_64 = (1 << 32) // 20  # randperm_cpu draws 64-bit words from here on


def effect(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], drawn: Drawn
) -> Effect | None:
    """The draws of ``func(*args, **kwargs)`` on a CPU generator, or None if unmodeled.

    ``drawn`` is the tensor the random numbers are written to (the output,
    or ``self`` for in-place ops). Tensors may be real, fake or
    :class:`TensorInfo`: only their metadata is read.
    """
    packet = func.overloadpacket
    if os.environ.get("TORCHDEFER_RNG_JUMPS") == "0" or not mt19937.layout_known():
        return None
    if packet in NORMAL_BLOCKS or packet in _SERIAL_NORMAL:
        n = drawn.numel()
        serial = packet in _SERIAL_NORMAL or n < 16 or not drawn.is_contiguous()
        shape = "serial" if serial else "fill"
    elif packet in _LINEAR:
        n = drawn.numel()
        shape = "linear" if packet is not _aten.randperm or n < _RANDPERM_64 else "none"
        if packet is _aten.randperm:
            n = schema_value(func, args, kwargs, "n")
    else:
        return None
    if shape == "none" or n == 0:
        return Effect() if n == 0 else None
    key = _class_key(func, args, kwargs, drawn, shape)
    model = _measured(key)
    if model is None:
        return None
    return model(n)


def schema_value(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    """Argument ``name`` of a call to ``func`` (its default if not passed); KeyError if none."""
    for i, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            return args[i] if i < len(args) else kwargs.get(name, argument.default_value)
    raise LookupKeyError(f"{func} has no argument named {name!r}; its arguments are "
                         f"{[a.name for a in func._schema.arguments]}")


@dataclass(frozen=True, slots=True)
class _Key:
    """One class of call: everything about it but its size."""

    func: Any
    shape: str  # "fill", "serial" or "linear"
    contiguous: bool
    tensors: tuple[tuple[int, torch.dtype], ...]  # (position, dtype) of tensor arguments
    scalars: tuple[tuple[str, Any], ...]  # path-choosing non-tensor arguments
    drawn_dtype: torch.dtype


_SKIPPED = frozenset({"generator", "device", "layout", "pin_memory", "size", "n"})


@functools.cache
def _arguments(func: Any) -> tuple[tuple[int, str, Any, bool], ...]:
    """Per schema argument: (index, name, default, whether it can choose a code path)."""
    free = _PATH_FREE.get(func.overloadpacket, ())
    return tuple(
        (i, a.name, a.default_value if a.has_default_value() else None, a.name not in free)
        for i, a in enumerate(func._schema.arguments)
    )


def _class_key(
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    drawn: Drawn,
    shape: str,
) -> _Key:
    tensors: list[tuple[int, torch.dtype]] = []
    scalars: list[tuple[str, Any]] = []
    n_args = len(args)
    for i, name, default, path in _arguments(func):
        value = args[i] if i < n_args else kwargs.get(name, default)
        if isinstance(value, (torch.Tensor, TensorInfo)):
            tensors.append((i, value.dtype))
        elif path and name not in _SKIPPED:
            scalars.append((name, _hashable(value)))
    # Normal samples are taken at sizes whose path is the class's own (below
    # 16 elements is the cached-normal path whatever the layout).
    contiguous = shape != "linear" or drawn.is_contiguous()
    return _Key(func, shape, contiguous, tuple(tensors), tuple(scalars), drawn.dtype)


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


# ---------------------------------------------------------------- measuring

_SIZES = {"linear": (1, 2, 3, 17, 100), "fill": (16, 17, 32, 33, 50), "serial": (1, 2, 3, 5)}


@functools.cache
def _measured(key: _Key) -> Callable[[int], Effect] | None:
    """The model of ``key``'s class if one known shape fits every measured size."""
    try:
        if key.shape == "serial":
            return _fit_serial(key)
        runs = {n: _run_sample(key, n) for n in _SIZES[key.shape]}
    except Exception:  # a call we cannot rebuild at another size: unmodeled
        return None
    words = {n: r[0] for n, r in runs.items()}
    if any(r[1] for r in runs.values()):  # touched a normal cache: not a plain draw
        return None
    if key.shape == "fill":
        per = words[16] // 16
        candidates = [_fill_model(per, f) for f in _FILL_SHAPES]
    else:
        a = words[2] - words[1]
        b = words[1] - a
        candidates = [lambda n: Effect(words=a * n + b)]
    for model in candidates:
        if all(model(n).words == w for n, w in words.items()):
            return model
    return None


def _fill_model(per: int, shape: Callable[[int], int]) -> Callable[[int], Effect]:
    return lambda n: Effect(words=per * shape(n))


# Contiguous normal_ of 16 or more elements: uniforms for every element, then
# 16 more to recompute the last block when the count is not a multiple of 16
# (float32/float64); whole blocks of 16 (float16/bfloat16 on torch 2.13).
_FILL_SHAPES: tuple[Callable[[int], int], ...] = (
    lambda n: n + (16 if n % 16 else 0),
    lambda n: -(-n // 16) * 16,
)


def _fit_serial(key: _Key) -> Callable[[int], Effect] | None:
    """Cached-normal classes must behave as ``at::normal_distribution<double>``."""
    for n in _SIZES["serial"]:
        for cached in (False, True):
            words, _, valid_after = _run_sample(key, n, with_cached_normal=cached)
            remaining = n - (1 if cached else 0)
            if words != 4 * ((remaining + 1) // 2) or valid_after != bool(remaining % 2):
                return None
    return lambda n: Effect(normals=n)


def _run_sample(key: _Key, n: int, with_cached_normal: bool = False) -> tuple[int, bool, bool]:
    """Run ``key``'s call at size ``n`` from a probe state: (words, cache touched, valid after)."""
    probe = torch.Generator()
    probe.manual_seed(0x5EED + n)
    if with_cached_normal:
        torch.empty(1, dtype=torch.float64, device="cpu").normal_(generator=probe)
    before = probe.get_state()
    after = _call_with_state(key, n, before)
    words = words_between(before, after)
    caches = mt19937.CACHES
    touched = with_cached_normal or not torch.equal(before[caches], after[caches])
    return words, touched, mt19937.cache_valid(after)


def _call_with_state(key: _Key, n: int, state: torch.Tensor) -> torch.Tensor:
    schema = key.func._schema
    tensor_dtypes = dict(key.tensors)
    scalars = dict(key.scalars)
    call_args: list[Any] = []
    call_kwargs: dict[str, Any] = {}
    has_generator = any(a.name == "generator" for a in schema.arguments)
    generator = torch.Generator()
    generator.set_state(state)
    for i, argument in enumerate(schema.arguments):
        name = argument.name
        if i in tensor_dtypes:
            value: Any = _sample_tensor(n, tensor_dtypes[i], key.contiguous)
        elif name == "size":
            value = [n]
        elif name == "n":
            value = n
        elif name == "generator":
            value = generator
        elif name in scalars:
            value = scalars[name]
        elif name in ("device", "layout", "pin_memory"):
            value = None
        elif argument.has_default_value():
            continue  # path-free float arguments: their defaults do
        else:
            value = 0.5
        if argument.kwarg_only:
            call_kwargs[name] = value
        else:
            call_args.append(value)
    if has_generator:
        key.func(*call_args, **call_kwargs)
        return generator.get_state()
    default = torch.default_generator
    saved = get_state(default)  # as it is: a recording's marker stays one
    try:
        default.set_state(state)
        key.func(*call_args, **call_kwargs)
        return get_state(default)
    finally:
        default.set_state(saved)


def _sample_tensor(n: int, dtype: torch.dtype, contiguous: bool) -> torch.Tensor:
    """``n`` elements of value 0.5 (a valid probability, mean and std alike)."""
    if contiguous:
        return torch.empty(n, dtype=dtype, device="cpu").fill_(0.5)
    return torch.empty(n, 2, dtype=dtype, device="cpu")[:, 0].fill_(0.5)


def words_between(before: torch.Tensor, after: torch.Tensor, limit: int = 64) -> int:
    """How many words the engine drew from ``before`` to ``after`` (at most ``limit`` refills)."""
    consumed_before = mt19937.N - mt19937.words_left_in_block(before)
    consumed_after = mt19937.N - mt19937.words_left_in_block(after)
    target = mt19937.array_of(after)
    refills = mt19937._sequence(mt19937.array_of(before), limit).view(-1, mt19937.N)
    for k in range(limit + 1):
        if torch.equal(refills[k], target):
            return mt19937.N * k + consumed_after - consumed_before
    raise UsageError(f"words_between: `after` is not within {limit} refills of the Mersenne "
                     "Twister from `before` (or not a state reached from it); pass a larger "
                     "limit= if the call drew more")
