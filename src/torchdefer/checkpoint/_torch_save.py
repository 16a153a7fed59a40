"""``torch.save`` files: always ``weights_only``; memory-mapped only where that is exact.

Opening reads the archive's ``data.pkl`` with torch's ``weights_only``
unpickler and *meta* storages: every key, shape, dtype and storage size is
known before any tensor data is read, and a pickle that names anything but
tensors and plain containers is refused before it can run.

The data is then read with ``torch.load(weights_only=True)``, memory-mapped
(``mmap=True``) only when every storage record is stored uncompressed and
exactly as long as the pickle declares: ``mmap`` reads the archive's bytes
where the record starts, so a compressed record would come back as
compressed bytes and a short one would read the next record's bytes. Any
other archive is read plainly, where torch inflates each record. A record
shorter than declared is refused here, before torch reads it: torch 2.8 does
not check and fills the rest from uninitialized memory. Files in the pre-1.6
(non-zip) format are read as ``torch.load`` reads them (``weights_only``, no
``mmap``). Tensors read through ``mmap`` are copied out of the mapping one at a
time: a model must not keep a file's pages,
which ``torch.save`` to the same path rewrites in place.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from torchdefer._compat.serialization import weights_only_unpickler
from torchdefer.checkpoint._source import CheckpointSource, from_mapping
from torchdefer.errors import CheckpointFormatError, UnsafeCheckpointError

__all__ = ["open_file"]


def open_file(path: Path) -> CheckpointSource:
    """A source over the ``torch.save`` file ``path`` (zip or legacy format)."""
    with path.open("rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"
    if not is_zip:
        return from_mapping(_state_dict(_torch_load(path, mmap=False), path), str(path))
    header, mmap = _read_header(path)
    source = from_mapping(_state_dict(header, path), str(path), header=True)
    loaded: dict[str, Any] = {}

    def read(key: str) -> torch.Tensor:
        if not loaded:
            loaded.update(_state_dict(_torch_load(path, mmap=mmap), path))
            _same_as_header(loaded, header, path)
        value = loaded[key]
        # Never hand the model the file's pages: torch.save truncates and rewrites
        # a file in place, so saving the trained model to the path it was loaded
        # from would change (or SIGBUS) every weight still mapped from it.
        return value.clone() if mmap and isinstance(value, torch.Tensor) else value

    source.read = read
    source.kind = "torch.save"
    if not mmap:
        source.notes.append(f"{path} is read without mmap (compressed or inexact records)")
    return source


def _torch_load(path: Path, mmap: bool) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        raise _unpickling(path, e) from None
    except Exception as e:  # RuntimeError from the zip reader, EOFError, ValueError, ...
        raise _damaged(path, e) from e


def _read_header(path: Path) -> tuple[Any, bool]:
    """``data.pkl`` unpickled onto meta storages, each storage's size, and whether mmap is exact."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise _damaged(path, e) from e
    with archive:
        names = archive.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
        if any(n.endswith("/constants.pkl") for n in names):
            raise UnsafeCheckpointError(
                f"{path} is a TorchScript archive: loading it runs its code. torchdefer loads "
                "weights only; save a state dict (torch.save(model.state_dict(), path))."
            )
        if len(pickles) != 1:
            raise CheckpointFormatError(
                f"{path} is a zip archive but not a torch.save file (no single "
                "<name>/data.pkl member). Pass a torch.save, safetensors or DCP checkpoint."
            )
        prefix = pickles[0][: -len("data.pkl")]
        try:
            pickled = archive.read(pickles[0])
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise _damaged(path, e) from e
        header, sizes = _unpickle_meta(pickled, path)
        mmap = all(_exact_record(archive, f"{prefix}data/{key}", n, path)
                   for key, n in sizes.items())
    return header, mmap


def _unpickle_meta(pickled: bytes, path: Path) -> tuple[Any, dict[str, int]]:
    sizes: dict[str, int] = {}
    storages: dict[str, torch.TypedStorage] = {}

    def persistent_load(saved_id: Any) -> torch.TypedStorage:
        if not (isinstance(saved_id, tuple) and len(saved_id) == 5 and saved_id[0] == "storage"):
            raise CheckpointFormatError(f"{path}: data.pkl names an unknown record {saved_id!r}.")
        _, storage_type, key, _location, numel = saved_id
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        if key not in storages:
            sizes[key] = numel * dtype.itemsize
            storages[key] = torch.TypedStorage(
                wrap_storage=torch.UntypedStorage(sizes[key], device="meta"), dtype=dtype,
                _internal=True)
        return storages[key]

    unpickler = weights_only_unpickler(io.BytesIO(pickled), encoding="utf-8")
    unpickler.persistent_load = persistent_load  # type: ignore[method-assign]  # pickle's hook
    try:
        return unpickler.load(), sizes
    except CheckpointFormatError:
        raise
    except pickle.UnpicklingError as e:
        raise _unpickling(path, e) from None
    except Exception as e:
        raise _damaged(path, e) from e


def _exact_record(archive: zipfile.ZipFile, name: str, nbytes: int, path: Path) -> bool:
    """Whether ``name`` is stored uncompressed, ``nbytes`` long, wholly inside the file."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        raise CheckpointFormatError(
            f"{path}: data.pkl refers to the record {name}, which the archive lacks. The file "
            "is damaged; save it again."
        ) from None
    if info.file_size < nbytes:
        # torch 2.8's reader does not compare a record's length with the pickle's
        # (later ones refuse): it returns the missing bytes from uninitialized memory.
        raise CheckpointFormatError(
            f"{path}: the record {name} holds {info.file_size} bytes where data.pkl declares "
            f"{nbytes}. The file is truncated or damaged; save it again."
        )
    if info.compress_type != zipfile.ZIP_STORED or info.file_size != nbytes:
        return False
    if info.compress_size != info.file_size:
        return False
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        return False
    start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") \
        + int.from_bytes(local[28:30], "little")
    return start + nbytes <= os.path.getsize(path)


def _state_dict(obj: Any, path: Path) -> Mapping:
    if not isinstance(obj, Mapping):
        raise CheckpointFormatError(
            f"{path} holds a {type(obj).__name__}, not a state dict (a mapping of names to "
            "tensors). Save model.state_dict(), or pass the state dict inside it "
            "(e.g. torch.load(path, weights_only=True)['model'])."
        )
    return obj


def _same_as_header(loaded: Mapping, header: Mapping, path: Path) -> None:
    for key, meta in header.items():
        value = loaded.get(key)
        if isinstance(meta, torch.Tensor) and not (
                isinstance(value, torch.Tensor) and value.shape == meta.shape
                and value.dtype == meta.dtype):
            raise CheckpointFormatError(
                f"{path}: '{key}' read back differently from its header; the file changed "
                "while it was being loaded, or is damaged. Load it again."
            )


def _unpickling(path: Path, error: pickle.UnpicklingError) -> Exception:
    """A refused global or class is a file asking to run code; anything else is damage."""
    text = str(error).lower()
    if "global" in text or "unsupported class" in text:
        return _unsafe(path, error)
    return _damaged(path, error)


def _unsafe(path: Path, error: BaseException) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{path} holds something other than tensors and plain containers, which only runs "
        f"with weights_only=False (it could run code from the file); refused: {error}. "
        "If you trust the file, load it with torch.load yourself and pass the state dict."
    )


def _damaged(path: Path, error: BaseException) -> CheckpointFormatError:
    return CheckpointFormatError(
        f"{path} is not a readable torch.save file ({type(error).__name__}: {error}). It may "
        "be truncated or in another format; pass a torch.save, safetensors or DCP checkpoint."
    )
