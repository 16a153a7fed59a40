"""The private torch APIs that checkpoint reading uses.

* ``torch._weights_only_unpickler.Unpickler``: the unpickler ``torch.load(...,
  weights_only=True)`` runs; reading a ``torch.save`` file's ``data.pkl`` with
  it and meta storages gives every tensor's shape, dtype and storage size
  before any data is read (2.8-2.15 expose it under this name).
* The classes ``torch.distributed.checkpoint`` pickles into ``.metadata``
  (checked against ``dcp.save`` output in 2.8-2.15); ``_StorageInfo`` and
  ``_MEM_FORMAT_ENCODING`` are private names. Imported only when a DCP
  checkpoint is read.
* Writing a DCP file the way ``FileSystemWriter`` writes it, item by item:
  ``filesystem._write_item`` (one item's bytes at the stream's position, and
  the ``_StorageInfo`` that ``.metadata`` records for it), the writer's
  ``transforms`` and ``serialization_format``, the plan's ``_StoragePrefix``
  and ``DEFAULT_SUFFIX`` (the same names and signature in 2.8-2.15). The
  streaming writer uses them instead of DCP's own file loop, which keeps a
  reference to the tensor it wrote while it asks for the next one.
* ``torch.save`` up to 2.8 leaves its storages in a reference cycle (a class
  defined in ``_save`` keeps the ``persistent_id`` closure and its dict of
  storages alive until the garbage collector runs; fixed later in torch). The
  writer asks :func:`torch_save_keeps_storages` and collects the young
  generations after each tensor where it does.
"""

from __future__ import annotations

import functools
import gc
import importlib
import io
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import _weights_only_unpickler

from torchdefer.errors import MissingDependencyError

if TYPE_CHECKING:
    from torch.distributed.checkpoint.filesystem import _StorageInfo

__all__ = [
    "check_dcp_writer",
    "dcp_file_name",
    "dcp_metadata_global",
    "dcp_write_item",
    "storage_info_type",
    "torch_save_keeps_storages",
    "weights_only_unpickler",
]

weights_only_unpickler = _weights_only_unpickler.Unpickler

# (module, name) pairs a DCP .metadata pickle may name; nothing else is resolved.
_DCP_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
    ("pathlib._local", "PosixPath"), ("pathlib._local", "PurePosixPath"),
    ("pathlib._local", "WindowsPath"), ("pathlib._local", "PureWindowsPath"),
}


def dcp_metadata_global(module: str, name: str) -> Any | None:
    """The object a DCP ``.metadata`` pickle may refer to as ``module.name``, else None.

    Dtypes (``torch.float32``) are allowed by value: the name must resolve to a
    ``torch.dtype``, never to a function of the torch module.
    """
    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)
    if (module, name) not in _DCP_GLOBALS:
        return None
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def storage_info_type() -> type[_StorageInfo]:
    """DCP's per-entry storage record class (``filesystem._StorageInfo``)."""
    from torch.distributed.checkpoint import filesystem

    return filesystem._StorageInfo


def dcp_file_name(plan: Any, number: int) -> str:
    """The name ``FileSystemWriter`` gives a rank's ``number``-th file (``__0_0.distcp``)."""
    from torch.distributed.checkpoint import filesystem

    return f"{plan.storage_data.prefix}{number}{filesystem.DEFAULT_SUFFIX}"


def dcp_write_item(writer: Any, stream: Any, data: Any, item: Any, file_name: str) -> Any:
    """Write one item at ``stream``'s position as ``FileSystemWriter`` does; its WriteResult.

    ``writer`` is a ``FileSystemWriter`` (its stream transforms and serialization
    format are used); ``data`` a CPU tensor whose storage is exactly its bytes, or
    a ``BytesIO``.
    """
    from torch.distributed.checkpoint import filesystem

    return filesystem._write_item(writer.transforms, stream, data, item, file_name,
                                  writer.serialization_format)


def check_dcp_writer() -> None:
    """Raise MissingDependencyError (an ImportError) where this torch lacks the DCP
    writer pieces used above."""
    from torch.distributed.checkpoint import filesystem

    missing = [n for n in ("_write_item", "DEFAULT_SUFFIX", "_FileSystemWriter")
               if not hasattr(filesystem, n)]
    if missing:
        raise MissingDependencyError(f"torch.distributed.checkpoint.filesystem lacks {missing} "
                                     f"in this torch {torch.__version__}")


@functools.cache
def torch_save_keeps_storages() -> bool:
    """Whether ``torch.save`` leaves the storages it wrote alive until the next gc run."""
    enabled = gc.isenabled()
    gc.disable()  # the cycle must not be collected while we look for it
    try:
        tensor = torch.zeros(1)
        ref = weakref.ref(tensor.untyped_storage())
        torch.save(tensor, io.BytesIO())
        del tensor
        storage = ref()
        # torch 2.8 can keep a storage's Python object after its memory went
        # (use count 0): the C++ use count says whether the bytes are held.
        return storage is not None and torch._C._storage_Use_Count(storage._cdata) > 0
    finally:
        if enabled:
            gc.enable()
