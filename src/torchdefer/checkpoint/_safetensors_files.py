"""safetensors checkpoints: one file, or a directory of shards with or without an index.

Only headers are read when opening (``safe_open`` maps the file; tensors are
read on request, each a view of the file's pages without a copy). The
directory layout is Hugging Face's: ``model.safetensors``, or shards listed by
``model.safetensors.index.json``'s ``weight_map``. The index is honoured
exactly: a shard it names must exist inside the directory and hold the keys
it lists; a key in two files, or in a shard but not in the index, is refused
rather than resolved by file order.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from torchdefer.checkpoint._source import CheckpointSource, Entry, regular_file
from torchdefer.errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    MissingDependencyError,
    UnsafeCheckpointError,
)

__all__ = ["open_directory", "open_files", "torch_dtype"]

# safetensors' dtype names; those this torch lacks are looked up by name and
# reported as unreadable entries when missing.
_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu", "C64": "complex64",
}


def torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of safetensors' dtype ``name``, or None if this torch has none."""
    dtype = getattr(torch, _DTYPES.get(name, ""), None)
    return dtype if isinstance(dtype, torch.dtype) else None


def open_directory(path: Path) -> CheckpointSource:
    """A source over a directory of safetensors files (index honoured if present)."""
    indexes = sorted(path.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise CheckpointFormatError(
            f"{path} holds {len(indexes)} safetensors indexes "
            f"({', '.join(i.name for i in indexes)}); "
            "pass the path of the one to load, or remove the others."
        )
    if indexes:
        return _open_indexed(path, indexes[0])
    files = sorted(f for f in path.glob("*.safetensors"))
    if not files:
        raise CheckpointNotFoundError(
            f"{path} holds neither *.safetensors files nor a torch.distributed.checkpoint "
            "(.metadata); pass a state dict, a .safetensors file, a directory of them, a "
            "torch.save file or a DCP checkpoint directory."
        )
    return open_files(files, str(path))


def open_files(files: list[Path], where: str, index: dict[str, Path] | None = None,
               index_path: Path | None = None) -> CheckpointSource:
    """A source over ``files``; a key held by two of them is an error naming both."""
    safe_open = _safe_open()
    handles: dict[str, Any] = {}
    entries: dict[str, Entry] = {}
    for file in files:
        regular_file(file, "safetensors file")
        handle = _open_one(safe_open, file)
        where = str(file)
        for key in handle.keys():
            if key in entries:
                raise CheckpointFormatError(
                    f"'{key}' is in both {entries[key].where} and {file}; a checkpoint must "
                    "hold each key once. Remove the stale file (or the duplicate key)."
                )
            placed = None if index is None else index.get(key)
            if placed is not file and index is not None and placed != file:
                raise CheckpointFormatError(
                    f"{file} holds '{key}', which {index_path} "
                    f"{'does not list' if key not in index else f'puts in {index[key]}'}; "
                    "the index and the shards disagree. Re-save the checkpoint."
                )
            entries[key] = _entry(handle, key, where)
            handles[key] = handle

    def read(key: str) -> torch.Tensor:
        try:
            return handles[key].get_tensor(key)
        except Exception as e:  # SafetensorError, OSError, a dtype this build cannot read
            raise CheckpointFormatError(
                f"Cannot read '{key}' from {entries[key].where}: {e}. The file is damaged; "
                "download or save it again."
            ) from e

    return CheckpointSource(where, entries, read, kind="safetensors", mapped=True)


def _open_indexed(directory: Path, index_path: Path) -> CheckpointSource:
    regular_file(index_path, "safetensors index")
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CheckpointFormatError(
            f"{index_path} is not a safetensors index (a JSON object with a 'weight_map' of "
            f"key -> shard file): {e!r}. Re-save the checkpoint or remove the index."
        ) from e
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise CheckpointFormatError(
            f"{index_path}: 'weight_map' must map each key to a shard file name."
        )
    shards: dict[str, Path] = {}
    for key, name in weight_map.items():
        if name not in shards:
            shards[name] = _inside(directory, name, key, index_path)
    for name, shard in shards.items():
        if not shard.exists():
            raise CheckpointNotFoundError(
                f"{index_path} puts keys (e.g. '{_first_key(weight_map, name)}') in {name}, "
                f"which is not in {directory}. Download the missing shard, or re-save the "
                "checkpoint."
            )
    placed = {key: shards[name] for key, name in weight_map.items()}
    source = open_files(list(shards.values()), str(directory), placed, index_path)
    for key, name in weight_map.items():
        if key not in source.entries:
            raise CheckpointFormatError(
                f"{index_path} puts '{key}' in {name}, which does not hold it. The shard or "
                "the index is stale; download or re-save the checkpoint."
            )
    return source


def _inside(directory: Path, name: str, key: str, index_path: Path) -> Path:
    """``directory / name`` where ``name`` is a plain relative path without ``..``."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not parts or name.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
        raise UnsafeCheckpointError(
            f"{index_path} puts '{key}' in {name!r}, outside {directory}; an index may only "
            "name files inside its own directory. Refused: re-save the checkpoint."
        )
    return directory.joinpath(*parts)


def _first_key(weight_map: dict[str, str], name: str) -> str:
    return next(k for k, v in weight_map.items() if v == name)


def _entry(handle: Any, key: str, where: str) -> Entry:
    view = handle.get_slice(key)
    shape, name = tuple(view.get_shape()), view.get_dtype()
    dtype = _dtype_named(name)
    if dtype is None:
        return Entry(shape, None, where,
                     f"has dtype {name}, which torch {torch.__version__} cannot hold",
                     CheckpointFormatError)
    return Entry(shape, dtype, where)


@functools.lru_cache(maxsize=64)  # names come from files: bounded
def _dtype_named(name: str) -> torch.dtype | None:
    return torch_dtype(name)


def _open_one(safe_open: Any, file: Path) -> Any:
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except Exception as e:  # SafetensorError (an Exception), OSError
        raise CheckpointFormatError(
            f"{file} is not a readable safetensors file: {e}. It may be truncated or not a "
            "safetensors file at all; download or save it again."
        ) from e


def _safe_open() -> Any:
    try:
        from safetensors import safe_open
    except ImportError as e:
        raise MissingDependencyError(
            "Loading safetensors files needs safetensors: pip install 'torchdefer[safetensors]' "
            "(or pip install safetensors)."
        ) from e
    return safe_open
