"""Output strides eager gives where the meta kernels give others.

``empty_like``, the other ``*_like`` factories, ``clone`` and ``_to_copy`` with
``memory_format=torch.preserve_format`` copy the input's strides exactly when
it is non-overlapping and dense (``at::empty_like``, ``at::clone``,
``at::_to_copy``). Their meta kernels compute canonical strides instead, which
differ on size-1 dimensions: ``torch.zeros(1, 5).t()`` has strides ``(1, 5)``,
its meta ``empty_like`` ``(1, 1)``. A fake tensor that reported those would
show user code other strides than eager, and replay would rebuild views of
the real storage with the wrong ones.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["eager_layout"]

_aten = torch.ops.aten
_PRESERVING = frozenset(
    {
        _aten.empty_like, _aten.zeros_like, _aten.ones_like, _aten.full_like,
        _aten.rand_like, _aten.randn_like, _aten.randint_like, _aten.clone, _aten._to_copy,
    }
)  # fmt: skip


def eager_layout(func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
    """``out`` (a meta tensor), restrided as eager would lay it out."""
    if getattr(func, "overloadpacket", None) not in _PRESERVING:
        return out
    if kwargs.get("memory_format") not in (None, torch.preserve_format):
        return out
    source = args[0] if args else None
    if not isinstance(out, torch.Tensor) or not isinstance(source, torch.Tensor):
        return out
    try:
        size, stride = tuple(source.shape), source.stride()
    except (RuntimeError, ValueError):  # an UninitializedParameter hides its shape
        return out
    if tuple(out.shape) != size or out.stride() == stride:
        return out
    if not _non_overlapping_and_dense(size, stride):
        return out
    return torch.empty_strided(size, stride, dtype=out.dtype, device="meta")


def _non_overlapping_and_dense(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """``Tensor.is_non_overlapping_and_dense`` (not public): a permuted contiguous layout."""
    expected = 1
    for st, n in sorted((st, n) for n, st in zip(size, stride) if n != 1):
        if st != expected:
            return False
        expected *= n
    return True
