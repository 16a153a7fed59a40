"""Output strides eager gives where the meta kernels give others.

Batch norm's CPU and CUDA kernels write a fresh tensor in the input's
*suggested* memory format (contiguous, or channels-last for 4-d/5-d inputs
strided that way); the meta kernel keeps the input's strides, so a transposed
input gave a fake output that ``.t().contiguous()`` then aliased while eager
copied it.

``empty_like``, the other ``*_like`` factories, ``clone`` and ``_to_copy`` with
``memory_format=torch.preserve_format`` copy the input's strides exactly when
it is non-overlapping and dense (``at::empty_like``, ``at::clone``,
``at::_to_copy``). Their meta kernels compute canonical strides instead, which
differ on size-1 dimensions: ``torch.zeros(1, 5).t()`` has strides ``(1, 5)``,
its meta ``empty_like`` ``(1, 1)``. A fake tensor that reported those would
show user code other strides than eager, and replay would rebuild views of
the real storage with the wrong ones.

LAPACK writes ``linalg_eig``'s eigenvectors column-major per matrix; torch
2.8's meta kernel gives row-major ones (fixed in later releases, where the
restriding below changes nothing).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["eager_layout", "meta_twin", "non_overlapping_and_dense", "suggest_memory_format"]

_aten = torch.ops.aten
_PRESERVING = frozenset(
    {
        _aten.empty_like, _aten.zeros_like, _aten.ones_like, _aten.full_like,
        _aten.rand_like, _aten.randn_like, _aten.randint_like, _aten.clone, _aten._to_copy,
    }
)  # fmt: skip


# op -> indices of its outputs that eager writes column-major per matrix
_COLUMN_MAJOR = {_aten.linalg_eig: (1,)}

_SUGGESTED_FORMAT = frozenset(
    {
        _aten.native_batch_norm, _aten._native_batch_norm_legit,
        _aten._native_batch_norm_legit_no_training, _aten._native_batch_norm_legit_functional,
    }
)  # fmt: skip


# id(op) -> (op, whether its packet is in one of the sets above): asked for
# every op, and OpOverload/OpOverloadPacket hash in Python.
_restrided: dict[int, tuple[Any, bool]] = {}


def eager_layout(func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
    """``out`` (meta tensors), restrided as eager would lay it out."""
    known = _restrided.get(id(func))
    if known is None:
        packet = getattr(func, "overloadpacket", None)
        special = packet in _SUGGESTED_FORMAT or packet in _COLUMN_MAJOR or packet in _PRESERVING
        known = _restrided[id(func)] = (func, special)  # keeps func, so its id stays its own
    if not known[1]:
        return out
    packet = getattr(func, "overloadpacket", None)
    if packet in _SUGGESTED_FORMAT:
        return _in_suggested_format(args[0], out)
    if packet in _COLUMN_MAJOR and isinstance(out, tuple):
        return tuple(_column_major(o) if i in _COLUMN_MAJOR[packet] else o
                     for i, o in enumerate(out))
    if packet not in _PRESERVING:
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
    if not non_overlapping_and_dense(size, stride):
        return out
    return torch.empty_strided(size, stride, dtype=out.dtype, device="meta")


def _column_major(t: Any) -> Any:
    if not isinstance(t, torch.Tensor) or t.dim() < 2:
        return t
    return torch.empty(*t.shape[:-2], t.shape[-1], t.shape[-2], dtype=t.dtype, device="meta").mT


def meta_twin(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with ``t``'s size, strides and dtype (no data, nothing else kept)."""
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")


def non_overlapping_and_dense(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """``Tensor.isnon_overlapping_and_dense`` (not public): a permuted contiguous layout."""
    expected = 1
    for st, n in sorted((st, n) for n, st in zip(size, stride) if n != 1):
        if st != expected:
            return False
        expected *= n
    return True


def _in_suggested_format(source: Any, out: Any) -> Any:
    """Batch norm's outputs: the first one laid out in ``source``'s suggested format."""
    if not isinstance(out, tuple) or not out or not isinstance(source, torch.Tensor):
        return out
    first = out[0]
    size = tuple(first.shape)
    fmt = suggest_memory_format(tuple(source.shape), source.stride())
    wanted = torch.empty(size, dtype=first.dtype, device="meta", memory_format=fmt)
    if wanted.stride() == first.stride():
        return out
    return (wanted, *out[1:])


def suggest_memory_format(size: tuple[int, ...], stride: tuple[int, ...]) -> torch.memory_format:
    """``Tensor.suggest_memory_format()`` for a strided tensor of ``size`` and ``stride``.

    Channels-last when the tensor is not contiguous and is channels-last
    contiguous or strided like channels-last (``c10/core/MemoryFormat.h``;
    checked against the CPU kernels on thousands of layouts in the tests).
    """
    if len(size) not in (4, 5):
        return torch.contiguous_format
    fmt = torch.channels_last if len(size) == 4 else torch.channels_last_3d
    probe = torch.empty_strided(size, stride, device="meta")
    if probe.is_contiguous():
        return torch.contiguous_format
    order = (1, 3, 2, 0) if len(size) == 4 else (1, 4, 3, 2, 0)
    if probe.is_contiguous(memory_format=fmt) or _channels_last_strides(size, stride, order):
        return fmt
    return torch.contiguous_format


def _channels_last_strides(size, stride, order) -> bool:
    """``is_channels_last_strides_2d_s4`` / ``_3d_s5``, ambiguities resolved as NCHW."""
    if stride[1] == 0:
        return False
    low = 0
    for d in order:
        if size[d] == 0 or stride[d] < low:
            return False
        if d == 0 and low == stride[1]:
            return False
        low = stride[d] * (size[d] if size[d] > 1 else 1)
    return True
