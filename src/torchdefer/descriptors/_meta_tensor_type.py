"""``MetaTensorType``: what is known about a tensor argument, without any tensor.

Descriptors form a lattice ordered by "admits more tensors":
:meth:`MetaTensorType.from_examples` gives the most specific descriptor that
admits its examples, and :meth:`MetaTensorType.widen` moves up just enough to
admit one more tensor, never dropping a tensor admitted before.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from torchdefer.errors import DescriptorMismatch, UsageError, UsageTypeError

__all__ = [
    "SCALARS",
    "Dim",
    "DimRange",
    "DimRanges",
    "MetaTensorType",
    "TensorCheck",
    "examples_descriptor",
]

Dim = int | str | None
"""One shape entry: static length, symbolic name, or any length."""

DimRange = tuple[int, int | None]
"""Inclusive ``(min, max)`` bounds of a symbolic length; ``max=None`` is unbounded."""

DimRanges = Mapping[str, DimRange] | Iterable[tuple[str, int, int | None]]
"""``dim_ranges=`` as given: ``{"b": (1, 64)}``, or ``(name, min, max)`` triples."""

SCALARS = (type(None), bool, int, float, str, torch.dtype, torch.device)
"""Plain values a descriptor may fix (value specialization)."""

# The RFC writes ``dtype=float``; each maps to what ``torch.empty(..., dtype=float)`` makes.
_PYTHON_DTYPES = {float: torch.float64, int: torch.int64, bool: torch.bool,
                  complex: torch.complex128}


@dataclass(frozen=True, slots=True)
class MetaTensorType:
    """Known properties of a tensor argument; ``None`` means "not known".

    Args:
        shape: list of ``int`` (static), ``str`` (symbolic: one name is one
            length across a call's descriptors) or ``None`` (any length)
            entries; ``None`` for an unknown shape.
        dtype: a ``torch.dtype`` (or ``float``/``int``/``bool``/``complex``).
        rank: number of dimensions, for rank-only descriptors (``rank=3``).
        device: ``"cuda"`` admits every CUDA device, ``"cuda:1"`` only that one.
        requires_grad: whether the tensor must (not) require grad.
        layout: e.g. ``torch.strided``.
        dim_ranges: inclusive bounds of symbolic lengths,
            ``{"b": (1, 64)}``; ``(lo, None)`` has no upper bound. A name
            bounded in several descriptors of one call gets the intersection.

    Example:
        >>> import torch
        >>> d = MetaTensorType(["b", 10], torch.float32, dim_ranges={"b": (1, 64)})
        >>> d.admits(torch.zeros(3, 10)), d.admits(torch.zeros(3, 11))
        (True, False)
        >>> MetaTensorType.from_examples(torch.zeros(2, 5), torch.zeros(3, 5))
        MetaTensorType(shape=['d0', 5], dtype=torch.float32, device='cpu', \
requires_grad=False, layout=torch.strided)
    """

    shape: tuple[Dim, ...] | None = None
    dtype: torch.dtype | None = None
    rank: int | None = field(default=None, kw_only=True)
    device: torch.device | None = field(default=None, kw_only=True)
    requires_grad: bool | None = field(default=None, kw_only=True)
    layout: torch.layout | None = field(default=None, kw_only=True)
    dim_ranges: tuple[tuple[str, int, int | None], ...] = field(default=(), kw_only=True)

    if TYPE_CHECKING:  # what the generated __init__ accepts; __post_init__ normalizes
        def __init__(
            self,
            shape: Sequence[Dim] | None = None,
            dtype: torch.dtype | type | None = None,
            *,
            rank: int | None = None,
            device: torch.device | str | None = None,
            requires_grad: bool | None = None,
            layout: torch.layout | None = None,
            dim_ranges: DimRanges = (),
        ) -> None: ...

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.shape is not None:
            set_(self, "shape", _normalize_shape(self.shape))
        if self.dtype is not None and not isinstance(self.dtype, torch.dtype):
            if self.dtype not in _PYTHON_DTYPES:
                raise UsageError(f"MetaTensorType: dtype must be a torch.dtype, got {self.dtype!r}")
            set_(self, "dtype", _PYTHON_DTYPES[self.dtype])
        if self.device is not None:
            set_(self, "device", torch.device(self.device))
        if self.rank is not None and (type(self.rank) is not int or self.rank < 0):
            raise UsageError(f"MetaTensorType: rank must be an int >= 0, got {self.rank!r}")
        if self.shape is not None:
            if self.rank not in (None, len(self.shape)):
                raise UsageError(f"MetaTensorType: rank={self.rank} contradicts shape "
                                 f"{list(self.shape)}; give one of them or make them agree")
            set_(self, "rank", len(self.shape))
        if self.requires_grad not in (None, True, False):
            raise UsageError("MetaTensorType: requires_grad must be a bool or None, got "
                             f"{self.requires_grad!r}")
        if self.layout is not None and not isinstance(self.layout, torch.layout):
            raise UsageError(f"MetaTensorType: layout must be a torch.layout, got {self.layout!r}")
        set_(self, "dim_ranges", _normalize_ranges(self.dim_ranges))

    @property
    def symbols(self) -> tuple[str, ...]:
        """The symbolic names in ``shape``, in order of first appearance."""
        return tuple(dict.fromkeys(d for d in (self.shape or ()) if isinstance(d, str)))

    @property
    def ranges(self) -> dict[str, DimRange]:
        """``dim_ranges`` as a dict ``{name: (min, max)}``."""
        return {name: (lo, hi) for name, lo, hi in self.dim_ranges}

    def admits(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` satisfies this descriptor on its own.

        Example:
            >>> MetaTensorType(["n", "n"]).admits(torch.zeros(2, 3))
            False
        """
        try:
            TensorCheck(self, self.ranges)(tensor, "tensor", {}, {}, None)
        except DescriptorMismatch:
            return False
        return True

    @classmethod
    def from_examples(cls, *tensors: torch.Tensor) -> MetaTensorType:
        """The most specific descriptor that every example satisfies.

        Properties equal in all examples are kept; a dimension whose length
        differs becomes symbolic (with no range: a length seen to vary is taken
        to vary freely), and dimensions whose lengths are equal in every example
        share one name (``d0``, ``d1``, ...).

        Args:
            *tensors: one or more example tensors.

        Example:
            >>> MetaTensorType.from_examples(torch.zeros(2, 2), torch.zeros(3, 3)).shape
            ('d0', 'd0')
        """
        if not tensors:
            raise UsageError("MetaTensorType.from_examples needs at least one example tensor")
        bad = [type(t).__name__ for t in tensors if not isinstance(t, torch.Tensor)]
        if bad:
            raise UsageTypeError(f"MetaTensorType.from_examples takes tensors, got {bad[0]}")
        return examples_descriptor(tensors, {})

    def widen(self, tensor: torch.Tensor) -> MetaTensorType:
        """A descriptor that admits ``tensor`` and everything ``self`` admits.

        Only what ``tensor`` violates is relaxed: a static length it differs on
        becomes a fresh symbol, a symbol it binds inconsistently is split, a
        range it falls outside is stretched, a dtype/device/... it differs on
        becomes unknown (devices of one type keep their type).

        Example:
            >>> MetaTensorType([2, 3], torch.float32).widen(torch.zeros(4, 3)).shape
            ('w0', 3)
        """
        if not isinstance(tensor, torch.Tensor):
            raise UsageTypeError(
                f"MetaTensorType.widen takes a tensor, got {type(tensor).__name__}"
            )
        if self.admits(tensor):
            return self
        shape, ranges, rank = self.shape, self.ranges, self.rank
        if rank is not None and rank != tensor.dim():
            shape, ranges, rank = None, {}, None
        elif shape is not None:
            shape, ranges = _widen_shape(shape, ranges, tuple(tensor.shape))
        kept = {n: getattr(self, n) if getattr(self, n) in (None, getattr(tensor, n)) else None
                for n in ("dtype", "layout", "requires_grad")}  # what it differs on: unknown
        return replace(self, shape=shape, rank=rank, dim_ranges=_normalize_ranges(ranges), **kept,
                       device=_join_devices([self.device, tensor.device]) if self.device else None)

    def __repr__(self) -> str:
        parts = [f"shape={list(self.shape)!r}" if self.shape is not None else
                 f"rank={self.rank}" if self.rank is not None else ""]
        parts += [f"{n}={v!r}" if n == "device" else f"{n}={v}"
                  for n, v in (("dtype", self.dtype), ("device", self.device and str(self.device)),
                               ("requires_grad", self.requires_grad), ("layout", self.layout))
                  if v is not None]
        if self.dim_ranges:
            parts.append(f"dim_ranges={self.ranges!r}")
        return f"MetaTensorType({', '.join(p for p in parts if p)})"


class TensorCheck:
    """One descriptor compiled for the check every call runs (kept lean: ~1 us).

    ``ranges`` are merged over the program; ``specialize`` (export, one graph
    per concrete dtype/rank/...) also binds ``None`` dims under ``(path, dim)``
    and appends the properties ``desc`` leaves unknown to ``facts``. Symbols
    are bound in ``env`` (name -> length), with ``where`` (name -> (path, dim))
    for messages.
    """

    __slots__ = ("device", "dtype", "free", "layout", "named", "rank", "requires_grad", "static",
                 "unknown")

    def __init__(self, desc: MetaTensorType, ranges: Mapping[str, DimRange],
                 specialize: bool = False) -> None:
        self.rank, self.dtype, self.layout = desc.rank, desc.dtype, desc.layout
        self.device, self.requires_grad = desc.device, desc.requires_grad
        shape = desc.shape if desc.shape is not None else (None,) * (desc.rank or 0)
        self.static = [(i, d) for i, d in enumerate(shape) if isinstance(d, int)]
        self.named = [(i, d, *ranges.get(d, (0, None)))
                      for i, d in enumerate(shape) if isinstance(d, str)]
        # None dims are bound too under export: each is a symbol whose coverage
        # (0/1, guards) is checked per call; with the rank unknown (None), every dim is.
        free = [i for i, d in enumerate(shape) if d is None]
        self.free = [] if not specialize else None if desc.rank is None else free
        unknown = [n for n, v in (("dtype", desc.dtype), ("device", desc.device),
                                  ("layout", desc.layout), ("ndim", desc.rank)) if v is None]
        self.unknown = operator.attrgetter(*unknown, "ndim") if specialize and unknown else None

    def __call__(self, t: Any, path: str, env: dict, where: dict, facts: list | None) -> None:
        if not isinstance(t, torch.Tensor):
            raise DescriptorMismatch(path, "type", "a Tensor", describe_value(t))
        shape = t.shape
        if self.rank is not None and len(shape) != self.rank:
            got = f"{len(shape)} (shape {list(shape)})"
            raise DescriptorMismatch(path, "ndim", str(self.rank), got)
        if self.dtype is not None and t.dtype is not self.dtype:
            raise DescriptorMismatch(path, "dtype", str(self.dtype), str(t.dtype))
        if self.device is not None and t.device != self.device and (
            self.device.index is not None or t.device.type != self.device.type
        ):
            raise DescriptorMismatch(path, "device", repr(str(self.device)), repr(str(t.device)))
        if self.layout is not None and t.layout is not self.layout:
            raise DescriptorMismatch(path, "layout", str(self.layout), str(t.layout))
        if self.requires_grad is not None and t.requires_grad is not self.requires_grad:
            raise DescriptorMismatch(path, "requires_grad", str(self.requires_grad),
                                     str(t.requires_grad))
        for i, want in self.static:
            if shape[i] != want:
                raise DescriptorMismatch(path, f"shape[{i}]", str(want), str(shape[i]))
        for i, name, lo, hi in self.named:
            size = shape[i]
            bound = env.get(name)
            if bound is None:
                if size < lo or (hi is not None and size > hi):
                    wanted = f"{name!r} in [{lo}, {'inf' if hi is None else hi}]"
                    raise DescriptorMismatch(path, f"shape[{i}]", wanted, str(size),
                                             f"{name!r} is outside its range")
                env[name] = size
                where[name] = (path, i)
            elif bound != size:
                first = "{}.shape[{}]".format(*where[name])
                raise DescriptorMismatch(path, f"shape[{i}]", f"{name!r} = {bound}", str(size),
                                         f"{name!r} is {bound} from {first}")
        for i in range(len(shape)) if self.free is None else self.free:
            env[(path, i)] = shape[i]
        if self.unknown is not None:
            # "ndim" added so that the getter returns a tuple; facts is a list when specializing.
            facts.extend(self.unknown(t)[:-1])  # type: ignore[union-attr]


def describe_value(value: Any) -> str:
    """A short description of a call's value for messages (``float 3.0``)."""
    if isinstance(value, torch.Tensor):
        return f"a Tensor of shape {list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of length {len(value)}"
    if isinstance(value, SCALARS):
        return f"{type(value).__name__} {value!r}"
    return f"a {type(value).__name__}"


def _normalize_shape(shape: Sequence[Dim]) -> tuple[Dim, ...]:
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
        raise UsageError(f"MetaTensorType: shape must be a list of dims, got {shape!r}")
    for i, d in enumerate(out := tuple(shape)):
        if not (d is None or (isinstance(d, str) and d) or (type(d) is int and d >= 0)):
            raise UsageError(f"MetaTensorType: shape[{i}] is {d!r}; each entry must be an int "
                             ">= 0 (static), a non-empty str (symbolic) or None (any length)")
    return out


def _normalize_ranges(ranges: DimRanges) -> tuple[tuple[str, int, int | None], ...]:
    items = [(k, *v) for k, v in ranges.items()] if isinstance(ranges, Mapping) else list(ranges)
    for entry in items:
        name, lo, hi = entry if len(entry) == 3 else (entry, None, None)
        if not (isinstance(name, str) and type(lo) is int and lo >= 0
                and (hi is None or (type(hi) is int and hi >= lo))):
            raise UsageError(f"MetaTensorType: dim_ranges entry {entry!r} is not (name, min, max) "
                             "with a str name, an int min >= 0 and an int max >= min or None")
    return tuple(sorted(items))


def _common(values: Iterable[Any]) -> Any:
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def _join_devices(devices: Iterable[torch.device | None]) -> torch.device | None:
    seen = set(devices)
    if None in seen:
        return None
    known = {d for d in seen if d is not None}  # all of them
    if len(known) == 1:
        return known.pop()
    types = {d.type for d in known}
    return torch.device(types.pop()) if len(types) == 1 else None


def examples_descriptor(tensors: Sequence[torch.Tensor],
                        names: dict[tuple[int, ...], str]) -> MetaTensorType:
    """The most specific descriptor of ``tensors``; dims whose lengths across
    the examples are the same vector share a name, kept in ``names`` (``d0``...)
    so that several tensors of one call can share them too."""
    shape = None
    if len({t.dim() for t in tensors}) == 1:
        shape = [column[0] if len(set(column)) == 1 else names.setdefault(column, f"d{len(names)}")
                 for column in zip(*(tuple(t.shape) for t in tensors))]
    return MetaTensorType(shape, _common(t.dtype for t in tensors),
                          rank=_common(t.dim() for t in tensors),
                          device=_join_devices(t.device for t in tensors),
                          requires_grad=_common(t.requires_grad for t in tensors),
                          layout=_common(t.layout for t in tensors))


def _widen_shape(shape: tuple[Dim, ...], ranges: dict[str, DimRange],
                 sizes: tuple[int, ...]) -> tuple[tuple[Dim, ...], dict[str, DimRange]]:
    taken = {d for d in shape if isinstance(d, str)}
    fresh = (n for n in map("w{}".format, itertools.count()) if n not in taken)
    out: list[Dim] = []
    first_size: dict[str, int] = {}
    split: dict[tuple[str, int], str] = {}
    ranges = dict(ranges)
    for d, size in zip(shape, sizes, strict=True):
        if d is None or d == size:
            out.append(d)
        elif isinstance(d, int):
            out.append(next(fresh))
        else:
            bound = first_size.setdefault(d, size)
            name = d if bound == size else split.setdefault((d, size), next(fresh))
            if name != d and d in ranges:
                ranges[name] = ranges[d]
            if name in ranges:
                lo, hi = ranges[name]
                ranges[name] = (min(lo, size), None if hi is None else max(hi, size))
            out.append(name)
    return tuple(out), ranges
