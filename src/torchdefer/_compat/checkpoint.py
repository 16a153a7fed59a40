"""The private torch APIs that checkpoint reading uses.

* ``torch._weights_only_unpickler.Unpickler``: the unpickler ``torch.load(...,
  weights_only=True)`` runs; reading a ``torch.save`` file's ``data.pkl`` with
  it and meta storages gives every tensor's shape, dtype and storage size
  before any data is read (2.8-2.15 expose it under this name).
* The classes ``torch.distributed.checkpoint`` pickles into ``.metadata``
  (checked against ``dcp.save`` output in 2.8-2.15); ``_StorageInfo`` and
  ``_MEM_FORMAT_ENCODING`` are private names. Imported only when a DCP
  checkpoint is read.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import _weights_only_unpickler

__all__ = ["dcp_metadata_global", "storage_info_type", "weights_only_unpickler"]

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


def storage_info_type() -> type:
    """DCP's per-entry storage record class (``filesystem._StorageInfo``)."""
    from torch.distributed.checkpoint import filesystem

    return filesystem._StorageInfo
