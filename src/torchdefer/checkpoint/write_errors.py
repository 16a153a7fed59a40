"""Errors raised while writing a checkpoint (defined in :mod:`torchdefer.errors`).

``except torchdefer.TorchdeferError`` (or ``CheckpointError``) catches them; the
built-in base (``FileExistsError``, ``ValueError``) keeps ordinary ``except``
clauses working. A save that raises one of these leaves nothing at the path it
was given (the files are written to a sibling directory, renamed at the end).
"""

from __future__ import annotations

from torchdefer.errors import CheckpointExistsError, CheckpointWriteError

__all__ = ["CheckpointExistsError", "CheckpointWriteError"]
