"""Hugging Face-style safetensors shards, written header first and then tensor by tensor.

``safetensors.torch.save_file`` needs every tensor of a file at once (it
serializes a dict and, in the version pinned here, copies each tensor to bytes
first), so a 5 GB shard would cost 5 GB or more. The format is simple enough to
stream: an 8-byte little-endian header length, a JSON header giving each
tensor's dtype, shape and byte range, padded with spaces to 8 bytes, then the
raw little-endian bytes. All of that is known from the recorded metadata
before any value exists, so each file is opened, its header written, and its
tensors appended one at a time as they are made (converted to the written
dtype in 64 MiB pieces, which rounds exactly as one whole ``.to(dtype)``).

The bytes are those ``safetensors.torch.save_file(tensors, metadata={"format":
"pt"})`` writes (tensors ordered by safetensors' dtype order, then name);
the directory is the one ``save_pretrained`` writes: shards split by
``huggingface_hub.split_torch_state_dict_into_shards``'s rule, named
``model-00001-of-00002.safetensors`` with ``model.safetensors.index.json``, or
one ``model.safetensors`` and no index when everything fits in one shard.
"""

from __future__ import annotations

import ctypes
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from torchdefer.checkpoint._pipeline import Pipeline
from torchdefer.checkpoint._write_plan import Entry
from torchdefer.errors import CheckpointWriteError, InternalError

__all__ = ["Shard", "index_json", "layout", "parse_size", "write_order", "write_shards"]

# safetensors' Dtype enum in declaration order: a file's tensors are sorted by
# it, descending, then by name (safetensors/src/tensor.rs, prepare()).
_ORDER = (
    ("bool", "BOOL"), ("uint8", "U8"), ("int8", "I8"), ("float8_e5m2", "F8_E5M2"),
    ("float8_e4m3fn", "F8_E4M3"), ("float8_e8m0fnu", "F8_E8M0"),
    ("float8_e4m3fnuz", "F8_E4M3FNUZ"), ("float8_e5m2fnuz", "F8_E5M2FNUZ"),
    ("int16", "I16"), ("uint16", "U16"), ("float16", "F16"), ("bfloat16", "BF16"),
    ("int32", "I32"), ("uint32", "U32"), ("float32", "F32"), ("complex64", "C64"),
    ("float64", "F64"), ("int64", "I64"), ("uint64", "U64"),
)
_RANK = {name: (rank, code) for rank, (name, code) in enumerate(_ORDER)}

_CHUNK_BYTES = 64 << 20  # converted and written per piece: bounds the conversion's copy
_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


@dataclass(frozen=True, slots=True)
class Shard:
    """One file: its name, its tensors in the order of their bytes, and its header."""

    filename: str
    entries: tuple[Entry, ...]
    header: bytes  # length prefix and padded JSON

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)


def parse_size(size: int | str) -> int:
    """``max_shard_size`` in bytes: an int, or ``"5GB"`` (10**9, as transformers) / ``"5GiB"``."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    if isinstance(size, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]I?B)\s*", size.upper())
        if match and float(match[1]) > 0:
            return int(float(match[1]) * _UNITS[match[2]])
    raise CheckpointWriteError(
        f"max_shard_size={size!r} is not a size: pass a positive number of bytes or a "
        "string such as '5GB' (10**9 bytes, as transformers) or '4GiB'."
    )


def safetensors_dtype(entry: Entry) -> tuple[int, str]:
    """(rank in safetensors' dtype order, safetensors' name) of the written dtype."""
    found = _RANK.get(str(entry.dtype).removeprefix("torch."))
    if found is None:
        raise CheckpointWriteError(
            f"'{entry.name}' would be written as {entry.dtype}, which safetensors cannot "
            "hold. Pass another dtype=, or use format='dcp'."
        )
    return found


def layout(entries: list[Entry], max_shard_size: int,
           dropped: dict[str, str] | None = None) -> list[Shard]:
    """Entries (in state-dict order) split into files as save_pretrained splits them.

    huggingface_hub's rule: in order, a tensor bigger than the limit gets a file
    of its own; otherwise a file is closed when the next tensor would overflow it.
    ``dropped`` (tie name not written -> name written) goes into the metadata of
    the file holding the written name, as ``safetensors.torch.save_model`` notes it.
    """
    groups: list[list[Entry]] = []
    current: list[Entry] = []
    size = 0
    for entry in entries:
        safetensors_dtype(entry)  # refuse a dtype safetensors lacks before writing anything
        if entry.nbytes > max_shard_size:
            groups.append([entry])
            continue
        if size + entry.nbytes > max_shard_size:
            groups.append(current)
            current, size = [], 0
        current.append(entry)
        size += entry.nbytes
    if current or not groups:
        groups.append(current)
    count = len(groups)
    names = (["model.safetensors"] if count == 1 else
             [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)])
    return [_shard(name, group, dropped or {}) for name, group in zip(names, groups, strict=True)]


def _shard(filename: str, entries: list[Entry], dropped: dict[str, str]) -> Shard:
    ordered = sorted(entries, key=lambda e: (-safetensors_dtype(e)[0], e.name))
    written = {e.name for e in entries}
    metadata = {"format": "pt"}
    metadata.update({name: kept for name, kept in dropped.items() if kept in written})
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for e in ordered:
        header[e.name] = {"dtype": safetensors_dtype(e)[1], "shape": list(e.shape),
                          "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return Shard(filename, tuple(ordered), len(text).to_bytes(8, "little") + text)


def write_order(shards: list[Shard]) -> list[Entry]:
    return [e for shard in shards for e in shard.entries]


def index_json(shards: list[Shard], total_parameters: int | None) -> str | None:
    """``model.safetensors.index.json`` as save_pretrained writes it; None for one file."""
    if len(shards) == 1:
        return None
    metadata: dict[str, int] = {"total_size": sum(s.nbytes for s in shards)}
    if total_parameters is not None:
        metadata["total_parameters"] = total_parameters
    weight_map = {e.name: s.filename for s in shards for e in s.entries}
    return json.dumps({"metadata": metadata, "weight_map": weight_map},
                      indent=2, sort_keys=True) + "\n"


def write_shards(directory: Path, shards: list[Shard], pipeline: Pipeline) -> None:
    """The writer thread: each file's header, then its tensors as they come."""
    if sys.byteorder != "little":
        raise CheckpointWriteError("safetensors files are little-endian; writing them on a "
                                   "big-endian machine is not supported.")
    scratch: dict[torch.dtype, torch.Tensor] = {}  # one conversion buffer per written dtype
    for shard in shards:
        with open(directory / shard.filename, "wb") as f:
            f.write(shard.header)
            for expected in shard.entries:
                entry, tensor = pipeline.take()
                if entry is not expected:
                    raise InternalError(f"torchdefer's writer got '{entry.name}' where "
                                        f"'{expected.name}' was due; this is a bug, please "
                                        "report it.")
                _write_tensor(f, tensor, entry.dtype, scratch)
                del tensor
                pipeline.done(entry)
            # No fsync, as save_pretrained: the directory appears (by rename) only
            # once every file is complete.


def _write_tensor(f, tensor: torch.Tensor, dtype: torch.dtype,
                  scratch: dict[torch.dtype, torch.Tensor]) -> None:
    """Append ``tensor``'s bytes in ``dtype``, C order, converting piece by piece.

    A piece that needs converting or moving to the CPU is copied into a buffer
    reused for the whole run (``copy_`` rounds as ``.to`` does: ``.to`` is an
    empty tensor and a ``copy_``), so no fresh memory is faulted in per piece.
    """
    t = tensor.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    flat = t.reshape(-1)  # a view when contiguous; else one copy (save_pretrained: .contiguous())
    step = _CHUNK_BYTES // max(t.element_size(), dtype.itemsize)
    for start in range(0, flat.numel(), step):
        piece = flat[start:start + step]
        if piece.dtype != dtype or piece.device.type != "cpu":
            buffer = scratch.get(dtype)
            if buffer is None:
                # The longest piece any source dtype gives (step <= this).
                buffer = scratch[dtype] = torch.empty(_CHUNK_BYTES // dtype.itemsize,
                                                      dtype=dtype)
            piece = buffer[:piece.numel()].copy_(piece)
        nbytes = piece.numel() * piece.element_size()
        f.write((ctypes.c_char * nbytes).from_address(piece.data_ptr()))
