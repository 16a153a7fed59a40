"""Storages as ops change them: storage arguments, new versions, growth.

A storage argument (``x.set_(y.untyped_storage(), offset, size, stride)``) is
recorded as the deferred tensor that owns it (see ``fake._storage_objects``), so the
slice follows that tensor's writes; at replay the op gets the real tensor's
storage back. Every write makes a new version of a storage, and so does
growing it (``resize_``, ``set_`` with a size): every view sees the one grown
storage, as in eager.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdefer import _compat
from torchdefer.errors import RecordingError
from torchdefer.fake._storage_objects import storage_owner
from torchdefer.recorder._alias import AliasPlan
from torchdefer.recorder._graph import Graph, Node, NodeKind, Storage
from torchdefer.recorder._tensor import DeferredTensor

__all__ = ["StorageArgs", "is_storage", "owner_of", "record_growth", "resizable_by", "write"]


_EXTERNAL = NodeKind.EXTERNAL  # read once: an Enum member lookup costs ~0.1 µs on 3.11


def is_storage(x: Any) -> bool:
    return isinstance(x, (torch.UntypedStorage, torch.TypedStorage))


def owner_of(storage: Any, graph: Graph, func: Any, where: str) -> torch.Tensor:
    """The tensor whose storage ``storage`` is, or a RecordingError that says what to do.

    A storage object handed out by ``untyped_storage()`` names its owner; one
    made in C++ (``x.set_(y, offset, size, stride)`` passes ``y``'s storage on)
    is found among the tensors recorded over each storage (``Graph.holders``).
    """
    owner = storage_owner(storage)
    if owner is None:
        owner = graph.holders.over(storage)
    if owner is None:
        raise RecordingError(
            f"{func} got a storage object that no deferred tensor holds (a storage of a "
            f"real tensor, or one made with torch.UntypedStorage(...)), called at {where}. "
            "Deferred code can only point tensors at storages of deferred tensors: pass "
            "y.untyped_storage() of a tensor y created inside deferred_init, or x.set_(y)."
        )
    return owner


def resizable_by(plan: AliasPlan, tensors: list[DeferredTensor],
                 written: list[DeferredTensor]) -> list[DeferredTensor]:
    """The tensors whose storage an op that writes ``written`` may grow: those
    (``resize_``, an ``out=`` argument resized), and for an op given a storage
    (``set_``) every tensor argument and storage owner, which the schema does
    not mark as written (``x.set_(y, 0, (n,))`` grows ``y``'s storage)."""
    return tensors if plan.takes_storage else written


def record_growth(node: Node, tensors: list[DeferredTensor], before: dict[int, int]):
    """A version for each storage the op grew that it does not already write.

    Every view of a storage sees it grow (eager has one storage object), so
    the growth is a write of the storage like any other: the slice of any of
    its views replays it, and a later write that covers the storage's old
    size is not taken for a write of all of it (``Storage.nbytes_at``).
    """
    writes = []
    written = {id(s) for s, _ in node.writes}
    for t in tensors:
        storage = t._value.storage  # the record before the op: outputs are not wrapped yet
        if _compat.storage_id(t) != before[id(t)]:
            continue  # moved to another storage (set_): its old one is unchanged
        with _compat.DisableTorchFunctionSubclass():
            nbytes = t.untyped_storage().nbytes()
        if nbytes == storage.nbytes:
            continue
        if id(storage) not in written:
            written.add(id(storage))
            writes.append(write(node, storage))
        storage.grown = (*storage.grown, (storage.version, storage.nbytes))
        storage.nbytes = nbytes
    return tuple(writes)


def write(node: Node, storage: Storage) -> tuple[Storage, int]:
    """A new version of ``storage``, written by ``node``; refused where it is real."""
    if storage.creator.kind is _EXTERNAL:
        raise RecordingError(
            f"{node.op} at {node.where()} writes in place to a real tensor (one created "
            "outside deferred_init, one materialize_tensor/materialize_module returned "
            "inside it, or a real meta tensor such as torch.tensor(...) under a meta "
            "device); the write cannot be deferred. Clone it first (`t = t.clone()`), "
            "or do the update outside deferred_init."
        )
    if storage.materialized:
        raise RecordingError(
            f"{node.op} at {node.where()} writes to a tensor whose storage was "
            "already materialized; the real tensor would not see the write. Do all "
            "in-place updates before materializing (if materialize_tensor or "
            "materialize_module ran inside deferred_init, call it after deferred_init "
            "returns; to read values while building, use .tolist() or .item())."
        )
    storage.version += 1
    storage.writers.append(node)
    return storage, storage.version



class StorageArgs:
    """``op`` replayed with real tensors where it was called with their storages."""

    __slots__ = ("_names", "_positions", "op")

    def __init__(self, op: Any) -> None:
        self.op = op
        storage_args = [
            (i, a.name)
            for i, a in enumerate(op._schema.arguments)
            if "Storage" in str(a.type)
        ]
        self._positions = frozenset(i for i, _ in storage_args)
        self._names = frozenset(name for _, name in storage_args)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = tuple(
            _storage(a) if i in self._positions else a for i, a in enumerate(args)
        )
        kwargs = {k: _storage(v) if k in self._names else v for k, v in kwargs.items()}
        return self.op(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # _schema, overloadpacket, tags: the op's
        return getattr(self.op, name)

    def __str__(self) -> str:
        return str(self.op)

    def __repr__(self) -> str:
        return repr(self.op)


def _storage(x: Any) -> Any:
    return x.untyped_storage() if isinstance(x, torch.Tensor) else x
