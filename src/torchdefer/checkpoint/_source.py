"""A checkpoint as the loader sees it: entries (shape, dtype) first, tensor data on request.

Every reader (``safetensors_files``, ``torch_save``, ``dcp``) fills the
entries from what the file declares *before* any data is read, so that
:mod:`torchdefer.checkpoint._plan` can check every key, shape, dtype and tie
and refuse a bad checkpoint while the model is still untouched.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchdefer.errors import (
    CheckpointFormatError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
)
from torchdefer.fake import is_fake
from torchdefer.recorder._tensor import holds_deferred

__all__ = ["CheckpointSource", "Entry", "Source", "from_mapping", "open_checkpoint",
           "regular_file"]

Source = Mapping[str, torch.Tensor] | str | os.PathLike


@dataclass(frozen=True, slots=True)
class Entry:
    """What a checkpoint declares for one key, read without its data."""

    shape: tuple[int, ...]
    dtype: torch.dtype | None  # None: the entry cannot be a tensor (see ``problem``)
    where: str  # the file (and member) holding it, for errors
    problem: str | None = None  # why this entry cannot be loaded, if it cannot
    error: type[Exception] = CheckpointMismatchError  # what ``problem`` raises as


@dataclass(slots=True)
class CheckpointSource:
    """Entries by key, and how to read their tensors (``read_all`` reads a batch).

    ``read`` raises :class:`~torchdefer.errors.CheckpointFormatError`
    naming the file and key when the data is damaged.
    """

    where: str
    entries: dict[str, Entry]
    read: Callable[[str], torch.Tensor]
    read_all: Callable[[list[str]], dict[str, torch.Tensor]] | None = None
    kind: str = "checkpoint"
    notes: list[str] = field(default_factory=list)
    handle: Any = None  # the reader's own object (DCP: its checked metadata)
    # A state dict's ``_metadata`` (module prefix -> {"version": ...}), which
    # modules' own load logic reads; None where the checkpoint keeps none
    # (safetensors, DCP, a plain dict): as for eager, every version is None.
    versions: Mapping[str, Any] | None = None
    # Tensors ``read`` returns are views of files mapped into memory (no copy):
    # their pages can be mapped ahead of their first read (``checkpoint._pages``).
    mapped: bool = False

    def read_many(self, keys: list[str]) -> dict[str, torch.Tensor]:
        if self.read_all is not None:
            return self.read_all(keys)
        return {k: self.read(k) for k in keys}


def from_mapping(state: Mapping, where: str, header: bool = False) -> CheckpointSource:
    """A source over an in-memory state dict (also what ``torch.load`` returned).

    ``header``: ``state`` holds meta tensors standing for the file's (read later).
    """
    entries = {}
    for key, value in state.items():
        if not isinstance(key, str):
            continue  # never a module name; reported as nothing at all
        if isinstance(value, torch.Tensor):
            entries[key] = Entry(tuple(value.shape), value.dtype, where,
                                 None if header else _no_data(value))
        else:
            kind = "dict" if isinstance(value, Mapping) else type(value).__name__
            entries[key] = Entry((), None, where, f"holds a {kind}, not a tensor")
    versions = getattr(state, "_metadata", None)
    return CheckpointSource(where, entries, lambda key: state[key], kind="state dict",
                            versions=versions if isinstance(versions, Mapping) else None)


def _no_data(value: torch.Tensor) -> str | None:
    """Why a tensor of a state dict has no values to load, if it has none."""
    if holds_deferred(value) or is_fake(value):
        return "is a deferred tensor; materialize that model first"
    if value.device.type == "meta":
        return "is a meta tensor (no data)"
    return None


def regular_file(path: Path, what: str = "checkpoint") -> Path:
    """``path`` if it is a regular file; a FIFO or device would block or never end."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{what} {path} does not exist.") from None
    except OSError as e:
        raise CheckpointFormatError(f"Cannot read {what} {path}: {e}.") from e
    if not stat.S_ISREG(mode):
        raise CheckpointFormatError(
            f"{what} {path} is not a regular file (a FIFO, socket or device); reading it "
            "could block forever. Pass the path of the checkpoint file itself."
        )
    return path


def open_checkpoint(source: Source) -> CheckpointSource:
    """A :class:`CheckpointSource` for a state dict, a ``.safetensors`` file, a
    directory of them (with or without ``model.safetensors.index.json``) or a
    ``torch.save`` file (``.bin``, ``.pt``, ``.pth``, any other name).

    DCP directories are opened by :mod:`torchdefer.checkpoint._dcp`.
    """
    from torchdefer.checkpoint import _safetensors_files as safetensors_files
    from torchdefer.checkpoint import _torch_save as torch_save

    if isinstance(source, Mapping):
        return from_mapping(source, "the state dict")
    try:
        path = Path(source)
    except TypeError:
        raise CheckpointFormatError(
            f"Cannot load a checkpoint from a {type(source).__name__}; pass a state dict, "
            "a path to a .safetensors or torch.save file, or a checkpoint directory."
        ) from None
    if path.is_dir():
        return safetensors_files.open_directory(path)
    if not path.exists() and not path.is_symlink():
        raise CheckpointNotFoundError(f"checkpoint {path} does not exist.")
    regular_file(path)
    if path.suffix == ".safetensors" or _starts_like_safetensors(path):
        return safetensors_files.open_files([path], str(path))
    return torch_save.open_file(path)


def _starts_like_safetensors(path: Path) -> bool:
    # 8-byte little-endian header length, then a JSON object.
    with path.open("rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 32

