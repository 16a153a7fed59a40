"""Errors raised while writing a checkpoint; each keeps the built-in type callers expect.

``except torchdefer.TorchdeferError`` (or ``CheckpointError``) catches them; the
built-in base (``FileExistsError``, ``ValueError``) keeps ordinary ``except``
clauses working. A save that raises one of these leaves nothing at the path it
was given (the files are written to a sibling directory, renamed at the end).
"""

from __future__ import annotations

from torchdefer.checkpoint.errors import CheckpointError

__all__ = ["CheckpointExistsError", "CheckpointWriteError"]


class CheckpointExistsError(CheckpointError, FileExistsError):
    """The destination is a file or a non-empty directory; nothing is overwritten."""


class CheckpointWriteError(CheckpointError, ValueError):
    """The model or the arguments cannot be written as asked (format, dtype, shard
    size, tensors safetensors cannot hold, ties the format cannot express)."""
