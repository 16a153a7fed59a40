"""Rebuilding a view of a materialized storage the way eager made it: from its base.

A view recorded on fake tensors carries the meta kernels' strides. Where a
kernel lays out its output otherwise than its meta kernel (``abs`` of a
permuted tensor with a size-1 dimension, a convolution of a channels_last
input), those strides are not eager's, and a view rebuilt from them over the
real storage would address other elements. Eager took the view from the real
base, so this does too: from the newest value of the chain whose real layout
replay saw, the recorded view ops are run again on real tensors (views cost
no data; they read only sizes and strides). The result is eager's view of the
one real storage, strides included.

A chain step is a view op with one tensor argument in the storage, ``t.data``
(read, or set: the tensor then has the new data's layout),
an in-place or ``out=`` op that leaves the written tensor's layout as it was
(``copy_``, ``fill_``, ``torch.abs(x, out=v)``: the same tensor), or ``set_``
onto a tensor of the same storage.
A chain also ends at a value whose layout the call itself spelled out, the
same in eager and recorded: ``set_`` with a storage (and sizes and strides),
``resize_`` to other sizes (contiguous). Anything else ends it unresolved.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torchdefer.recorder._args import flatten_out, unflatten_call
from torchdefer.recorder._graph import NodeKind, TensorMeta, Value

__all__ = ["ValueKey", "same_elements", "through_views", "value_key"]

_SET_SOURCE = torch.ops.aten.set_.source_Tensor
# In-place ops whose output layout their arguments spell out (resize_: when the
# sizes change, eager and the meta kernel both make it contiguous).
_EXPLICIT = frozenset({torch.ops.aten.set_.source_Storage,
                       torch.ops.aten.set_.source_Storage_storage_offset})
_RESIZE = frozenset({torch.ops.aten.resize_.default})
_MAX_CHAIN = 1024  # a model's views of one storage are a few; this is a loop guard


ValueKey = tuple[int, int]
"""A value's name within its graph: its node's ``seq`` and its output index."""


def value_key(value: Value) -> ValueKey:
    """``value``'s :data:`ValueKey`: unique in its graph, and holds no part of it."""
    return value.node.seq, value.index


def through_views(
    value: Value,
    known: dict[ValueKey, TensorMeta],
    rebuild: Callable[[TensorMeta], torch.Tensor],
) -> torch.Tensor | None:
    """``value`` as eager made it over the storage ``rebuild(meta)`` rebuilds from,
    or None when no chain of view steps leads to a value in ``known``
    (value_key(value) -> its real layout)."""
    chain: list[Value] = []
    current = value
    while value_key(current) not in known and not _explicit(current):
        source = _source(current)
        if source is None or len(chain) >= _MAX_CHAIN:
            return None
        chain.append(current)
        current = source
    found = known.get(value_key(current))
    real = rebuild(current.meta if found is None else found)
    for step in reversed(chain):
        real = _step(step, real)
    return real


def _explicit(value: Value) -> bool:
    """Whether ``value``'s recorded layout is eager's because its call spelled it out."""
    node = value.node
    if node.kind != NodeKind.INPLACE:
        return False
    if node.op in _EXPLICIT:
        return True
    first = node.leaves[0] if node.leaves else None
    return (node.op in _RESIZE and isinstance(first, Value)
            and first.meta.size != value.meta.size)


def _source(value: Value) -> Value | None:
    """The value of the same storage ``value`` was taken from, layout and all."""
    node = value.node
    tensors = [leaf for leaf in node.leaves if isinstance(leaf, Value)]
    if node.kind in (NodeKind.VIEW, NodeKind.DATA_GET, NodeKind.DATA_SET):
        if len(tensors) == 1 and tensors[0].storage is value.storage:
            return tensors[0]
        return None
    if node.kind != NodeKind.INPLACE or not tensors:
        return None
    if node.op is _SET_SOURCE and len(tensors) == 2:
        source = tensors[1]
        same = source.storage is value.storage and source.meta == value.meta
        return source if same else None
    for leaf in tensors:  # the tensor written (self, or out=), its layout unchanged
        if leaf.storage is value.storage and leaf.meta == value.meta:
            return leaf
    return None


def _step(value: Value, base: torch.Tensor) -> torch.Tensor:
    node = value.node
    if node.kind != NodeKind.VIEW:
        return base  # the same tensor (t.data, an in-place write, set_ onto it)
    leaves = [base if isinstance(leaf, Value) else leaf for leaf in node.leaves]
    args, kwargs = unflatten_call(leaves, node.spec)
    out: torch.Tensor = flatten_out(node.op(*args, **kwargs))[value.index]
    return out


def same_elements(a: TensorMeta, b: TensorMeta) -> bool:
    """Whether two layouts address the same elements of a storage: they differ at
    most in the strides of dimensions of size 1 (which no index moves along), or
    they have no elements."""
    if a.size != b.size or a.dtype != b.dtype or (a.conj, a.neg) != (b.conj, b.neg):
        return False
    if 0 in a.size:
        return True
    if a.offset != b.offset:
        return False
    return all(n == 1 or x == y for n, x, y in zip(a.size, a.stride, b.stride))
