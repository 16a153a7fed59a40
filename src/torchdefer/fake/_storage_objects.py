"""The storage objects of fake tensors: the fake device reported, no data, no writes.

A fake tensor's storage is a meta storage. Handed out as is, it would report
``device='meta'``, answer reads with "Not available for 'meta' device type",
and take writes (``storage.fill_``, ``storage.resize_``) silently: the meta
storage changes, nothing is recorded, the materialized tensor never sees them.

``adopt`` turns the storage objects ``untyped_storage()``, ``storage()`` and
``_typed_storage()`` return into :class:`FakeUntypedStorage` /
:class:`FakeTypedStorage` by ``__class__`` assignment (PyTorch keeps one Python
object per storage, so the class and the owner stick). They report the fake
device, keep a weak reference to a tensor that uses them (so that
``x.set_(y.untyped_storage(), ...)`` can be recorded as a function of ``y``),
and refuse what needs data or would write, saying what to do instead.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

from torchdefer import _compat
from torchdefer.errors import FakeTensorError
from torchdefer.fake._pinned import storage_is_pinned

__all__ = ["STORAGE_GETTERS", "FakeTypedStorage", "FakeUntypedStorage", "adopt", "storage_owner"]

# Tensor methods that hand out a storage object.
STORAGE_GETTERS = frozenset(
    {torch.Tensor.untyped_storage, torch.Tensor.storage, torch.Tensor._typed_storage}
)

# Methods that read a storage's data or copy it somewhere.
_READS = (
    "__getitem__", "_getitem", "tolist", "__iter__", "cpu", "cuda", "hpu", "mps", "to", "_to",
    "type", "clone", "pin_memory", "__reduce__", "__deepcopy__", "__copy__", "_write_file",
    "double", "float", "half", "bfloat16", "long", "int", "short", "char", "byte", "bool",
    "complex_double", "complex_float", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz",
    "float8_e4m3fnuz", "_new_wrapped_storage", "_pickle_storage_type",
)
# Methods that write a storage's data or change its size.
_WRITES = (
    "__setitem__", "_setitem", "fill_", "copy_", "resize_", "_resize_", "share_memory_",
    "_share_memory_", "byteswap", "_byteswap", "_set_from_file", "_swap_data_ptr_",
    "_resize_with_addr_", "_set_cdata",
)


def _refuse(name: str, writes: bool):
    def refused(self: Any, *args: Any, **kwargs: Any) -> Any:
        if writes:
            raise FakeTensorError(
                f"storage.{name}() on the storage of a fake tensor (device "
                f"{self.device}, {self.nbytes()} bytes): a write through a storage object "
                "is not recorded, so the tensor would never see it. Write through the "
                "tensor instead (t.fill_(...), t.copy_(...), t.resize_(...)), or after "
                "materialization."
            )
        raise FakeTensorError(
            f"storage.{name}() needs the data of a fake tensor's storage (device "
            f"{self.device}, {self.nbytes()} bytes), and fake tensors have none. Read the "
            "tensor instead (t.tolist(), t.clone(); under deferred_init these are "
            "recorded), or materialize it first."
        )

    refused.__name__ = name
    return refused


def _device(self: Any) -> torch.device:
    return self.__dict__["_torchdefer_device"]


def _repr(self: Any) -> str:
    return f"{type(self).__name__}(device='{self.device}', nbytes={self.nbytes()}, fake=True)"


def _storage_class(base: type, name: str) -> type:
    namespace: dict[str, Any] = {
        "__doc__": f"A fake tensor's {base.__name__}: the fake device, no data, no writes.",
        "__module__": __name__,
        "__repr__": _repr,
        "__str__": _repr,
    }
    if base is torch.UntypedStorage:  # TypedStorage asks its untyped storage
        namespace["device"] = property(_device)
        namespace["data_ptr"] = address
        # Pinned if the recorded storage of a tensor using it was (fake._pinned).
        namespace["is_pinned"] = lambda self, device=None: storage_is_pinned(
            self, storage_owner(self))
    for method in _READS:
        if hasattr(base, method):
            namespace[method] = _refuse(method, writes=False)
    for method in _WRITES:
        if hasattr(base, method):
            namespace[method] = _refuse(method, writes=True)
    return type(name, (base,), namespace)


# Fake storages get addresses from one sequence, each a 2**40-byte range, so
# that data_ptr() answers "same storage?", "same element?" and "how far apart?"
# as eager pointers do (0 for an empty storage, as eager). Only relations mean
# anything; nothing is ever read at these addresses.
_addresses = itertools.count(1)


def address(storage: Any) -> int:
    """``storage.data_ptr()`` of a fake storage: a stable, unique fake address."""
    if storage.nbytes() == 0:
        return 0
    found = storage.__dict__.get("_torchdefer_address")
    if found is None:
        found = storage.__dict__["_torchdefer_address"] = next(_addresses) << 40
    return found


def data_ptr(tensor: torch.Tensor) -> int:
    """``tensor.data_ptr()`` of a fake tensor: its storage's address plus its offset."""
    with _compat.DisableTorchFunctionSubclass():
        storage = tensor.untyped_storage()
        offset = int(tensor.storage_offset()) * tensor.element_size()  # no SymInts here
    base = address(adopt(storage, tensor, tensor.fake_device))  # type: ignore[attr-defined]
    return base + offset if base else 0


FakeUntypedStorage = _storage_class(torch.UntypedStorage, "FakeUntypedStorage")
FakeTypedStorage = _storage_class(torch.TypedStorage, "FakeTypedStorage")


def adopt(storage: Any, tensor: torch.Tensor, device: torch.device) -> Any:
    """Make the storage object of fake ``tensor`` a fake storage owned by it."""
    if isinstance(storage, torch.TypedStorage):
        adopt(storage._untyped_storage, tensor, device)
        if type(storage) is torch.TypedStorage:
            storage.__class__ = FakeTypedStorage
        return storage
    if not isinstance(storage, torch.UntypedStorage):
        return storage
    if type(storage) is torch.UntypedStorage:
        storage.__class__ = FakeUntypedStorage
    if type(storage) is FakeUntypedStorage:
        storage.__dict__["_torchdefer_device"] = device
        if storage_owner(storage) is None:
            storage.__dict__["_torchdefer_owner"] = weakref.ref(tensor)
    return storage


def storage_owner(storage: Any) -> torch.Tensor | None:
    """A live tensor whose storage ``storage`` still is, or None."""
    if isinstance(storage, torch.TypedStorage):
        storage = storage._untyped_storage
    ref = getattr(storage, "__dict__", {}).get("_torchdefer_owner")
    owner = None if ref is None else ref()
    if owner is None or _compat.storage_id(owner) != storage._cdata:
        return None
    return owner
