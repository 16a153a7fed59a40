"""``torch.distributed.checkpoint`` (DCP) directories, read without running the file's pickles.

DCP's own reader unpickles ``.metadata`` with plain ``pickle`` and non-tensor
entries with ``torch.load(weights_only=False)``: either runs code from the
file. Here:

* ``.metadata`` is unpickled with an allowlist of DCP's metadata classes
  (``torchdefer._compat.serialization``), then checked field by field;
* only tensor entries are loaded: a key the module needs that DCP stored as
  a pickled object is an error, and the reader refuses any byte entry;
* every tensor's chunks must cover it exactly (no gap that would leave
  uninitialized memory, no overlap, nothing outside it), and each chunk's
  data must lie in a regular file inside the directory, within its length.

The data itself is read by ``dcp.load`` (tensors are ``torch.load``-ed with
``weights_only=True``) into fresh tensors, so a failing load changes nothing.
"""

from __future__ import annotations

import itertools
import math
import os
import pickle
import warnings
from pathlib import Path, PurePosixPath
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType

from torchdefer._compat.serialization import dcp_metadata_global, storage_info_type
from torchdefer.checkpoint._source import CheckpointSource, Entry, regular_file
from torchdefer.errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    UnsafeCheckpointError,
)

__all__ = ["load_into", "open_dcp", "read_metadata"]


def open_dcp(path: Path) -> CheckpointSource:
    """A source over the DCP directory ``path``; ``read_all`` loads in one ``dcp.load``."""
    metadata = read_metadata(path)
    entries = {key: _entry(path, key, md, metadata) for key, md in
               metadata.state_dict_metadata.items()}

    def read_all(keys: list[str]) -> dict[str, torch.Tensor]:
        targets = {k: torch.empty(entries[k].shape, dtype=entries[k].dtype, device="cpu")
                   for k in keys}
        load_into(targets, path, metadata, no_dist=True)
        return targets

    def read(key: str) -> torch.Tensor:
        return read_all([key])[key]

    return CheckpointSource(str(path), entries, read, read_all, kind="DCP", handle=metadata)


def read_metadata(path: Path) -> Metadata:
    """``path/.metadata`` unpickled through the allowlist and checked."""
    file = regular_file(path / ".metadata", "DCP metadata")
    with file.open("rb") as f:
        try:
            metadata = _MetadataUnpickler(f, file).load()
        except UnsafeCheckpointError:
            raise
        except Exception as e:
            raise CheckpointFormatError(
                f"{file} is not readable DCP metadata ({type(e).__name__}: {e}); the checkpoint "
                "is damaged or was not written by torch.distributed.checkpoint.save."
            ) from e
    _check_shape_of_metadata(metadata, file)
    return metadata


def load_into(targets: dict[str, torch.Tensor], path: Path, metadata: Metadata,
              no_dist: bool) -> None:
    """``dcp.load`` into ``targets`` (fresh tensors or DTensors), through the safe reader."""
    reader = _SafeReader(path, metadata)
    try:
        with warnings.catch_warnings():
            # "assuming the intent is to load in a single process": it is.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(targets, storage_reader=reader, no_dist=no_dist)
    except (KeyboardInterrupt, SystemExit):
        raise
    except UnsafeCheckpointError:
        raise
    except BaseException as e:  # DCP's CheckpointException is not an Exception
        raise CheckpointFormatError(
            f"Reading the tensors of {path} failed: {_short(e)}. The data files are damaged "
            "or do not match .metadata; re-save the checkpoint. Nothing was loaded."
        ) from None


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        found = dcp_metadata_global(module, name)
        if found is None:
            raise UnsafeCheckpointError(
                f"{self._path} asks to load {module}.{name}, which is not one of DCP's metadata "
                "classes; unpickling it could run code from the file. Refused; nothing ran."
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError(f"{self._path} holds a persistent id {pid!r}; refused.")


class _SafeReader(FileSystemReader):
    """DCP's file reader with the checked metadata, refusing pickled (byte) entries."""

    def __init__(self, path: Path, metadata: Metadata) -> None:
        super().__init__(str(path))
        self._checked = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self._checked

    def read_data(self, plan: Any, planner: Any) -> Any:
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                raise UnsafeCheckpointError(
                    f"{self.path}: '{item.dest_index.fqn}' is a pickled object, which would be "
                    "read with weights_only=False; torchdefer loads tensors only. Refused."
                )
        return super().read_data(plan, planner)


def _check_shape_of_metadata(metadata: Any, file: Path) -> None:
    ok = (isinstance(metadata, Metadata) and isinstance(metadata.state_dict_metadata, dict)
          and isinstance(metadata.storage_data, dict)
          and all(isinstance(k, str) for k in metadata.state_dict_metadata)
          and all(isinstance(k, MetadataIndex) for k in metadata.storage_data))
    if not ok:
        raise CheckpointFormatError(
            f"{file} does not hold DCP Metadata (a state_dict_metadata and storage_data "
            "dict); the checkpoint is damaged or not a DCP checkpoint."
        )


def _entry(path: Path, key: str, md: Any, metadata: Metadata) -> Entry:
    where = str(path / ".metadata")
    if isinstance(md, BytesStorageMetadata):
        return Entry((), None, where, "is a pickled (non-tensor) DCP entry, which "
                     "torchdefer never unpickles")
    if not isinstance(md, TensorStorageMetadata) or not isinstance(
            md.properties.dtype, torch.dtype):
        return Entry((), None, where, f"has metadata of type {type(md).__name__}",
                     CheckpointFormatError)
    shape = tuple(md.size)
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        return Entry((), None, where, f"declares the shape {shape}", CheckpointFormatError)
    problem = _coverage_problem(shape, md.chunks) or _storage_problem(path, key, md, metadata)
    if problem is not None:
        message, kind = problem
        return Entry(shape, md.properties.dtype, where, message, kind)
    return Entry(shape, md.properties.dtype, where)


def _coverage_problem(shape: tuple[int, ...], chunks: Any) -> tuple[str, type] | None:
    """Whether the chunks tile the tensor exactly: in bounds, disjoint, nothing left out."""
    boxes = []
    for chunk in chunks:
        offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
        if len(offsets) != len(shape) or len(sizes) != len(shape) or any(
                not isinstance(v, int) or v < 0 for v in (*offsets, *sizes)) or any(
                o + s > n for o, s, n in zip(offsets, sizes, shape)):
            return (f"has a chunk at {offsets} of size {sizes} outside its shape {shape}",
                    CheckpointFormatError)
        boxes.append((offsets, sizes))
    overlap = _overlap(boxes, shape)
    if overlap is not None:
        return (f"has overlapping chunks at {overlap[0]} and {overlap[1]}", CheckpointFormatError)
    covered = sum(math.prod(s) for _, s in boxes)
    if covered != math.prod(shape):
        return (f"has chunks covering {covered} of its {math.prod(shape)} elements (the rest "
                "would be uninitialized memory)", CheckpointFormatError)
    return None


def _overlap(boxes: list, shape: tuple[int, ...]) -> tuple | None:
    """Two chunks sharing an element, if any. Chunks split along one dimension (FSDP,
    tensor parallel) are checked as sorted intervals; other tilings pairwise."""
    boxes = [b for b in boxes if math.prod(b[1])]
    for dim in range(len(shape)):
        if all(o[d] == 0 and s[d] == shape[d] for o, s in boxes for d in range(len(shape))
               if d != dim):
            ordered = sorted(boxes, key=lambda b: b[0][dim])
            for (a_off, a_size), (b_off, _) in itertools.pairwise(ordered):
                if b_off[dim] < a_off[dim] + a_size[dim]:
                    return a_off, b_off
            return None
    for i, (a_off, a_size) in enumerate(boxes):
        for b_off, b_size in boxes[i + 1:]:
            if all(max(ao, bo) < min(ao + az, bo + bz)
                   for ao, az, bo, bz in zip(a_off, a_size, b_off, b_size)):
                return a_off, b_off
    return None


def _storage_problem(path: Path, key: str, md: Any, metadata: Metadata) -> tuple[str, type] | None:
    info_type = storage_info_type()
    for chunk in md.chunks:
        info = metadata.storage_data.get(MetadataIndex(key, chunk.offsets))
        if not isinstance(info, info_type):
            return (f"has no data for its chunk at {tuple(chunk.offsets)}", CheckpointFormatError)
        name = info.relative_path
        parts = PurePosixPath(str(name).replace("\\", "/")).parts if isinstance(name, str) else ()
        if not parts or name.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
            return (f"stores its data in {name!r}, outside the checkpoint directory",
                    UnsafeCheckpointError)
        file = path.joinpath(*parts)
        if not file.exists():
            return (f"stores its data in {name}, which is not in {path}", CheckpointNotFoundError)
        if not os.path.isfile(file) or (file.is_symlink() and not _inside(file, path)):
            return (f"stores its data in {name}, which is not a regular file inside {path}",
                    UnsafeCheckpointError)
        offset, length = info.offset, info.length
        if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0
                and length >= 0 and offset + length <= file.stat().st_size):
            return (f"declares bytes {offset}..{offset}+{length} of {name}, which is "
                    f"{file.stat().st_size} bytes long", CheckpointFormatError)
    return None


def _inside(file: Path, directory: Path) -> bool:
    return file.resolve().is_relative_to(directory.resolve())


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[-1] if text else ''}"[:500]
