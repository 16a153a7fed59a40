"""Ops called with storage objects (``x.set_(y.untyped_storage(), offset, size, stride)``).

A storage argument is recorded as the deferred tensor that owns it (see
``fake.storage``), so the slice follows that tensor's writes; at replay the
op gets the real tensor's storage back.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdefer.fake.storage import storage_owner
from torchdefer.recorder.errors import RecordingError

__all__ = ["StorageArgs", "is_storage", "owner_of"]


def is_storage(x: Any) -> bool:
    return isinstance(x, (torch.UntypedStorage, torch.TypedStorage))


def owner_of(storage: Any, func: Any, where: str) -> torch.Tensor:
    """The tensor whose storage ``storage`` is, or a RecordingError that says what to do."""
    owner = storage_owner(storage)
    if owner is None:
        raise RecordingError(
            f"{func} got a storage object that no deferred tensor holds (a storage of a "
            f"real tensor, or one made with torch.UntypedStorage(...)), called at {where}. "
            "Deferred code can only point tensors at storages of deferred tensors: pass "
            "y.untyped_storage() of a tensor y created inside deferred_init, or x.set_(y)."
        )
    return owner


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
