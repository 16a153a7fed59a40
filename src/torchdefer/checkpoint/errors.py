"""Errors raised while loading a checkpoint; each keeps the built-in type callers expect.

Defined in :mod:`torchdefer.errors` (one hierarchy), re-exported here. Every
message names the file (and the member or key), says what is wrong and what to
do. ``except torchdefer.TorchdeferError`` catches them all; the built-in base
(``ValueError``, ``KeyError``, ...) keeps older ``except`` clauses working. A
load that raises one of these changed nothing in the model.
"""

from __future__ import annotations

from torchdefer.errors import (
    CheckpointDeviceError,
    CheckpointError,
    CheckpointFormatError,
    CheckpointKeyError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointRankError,
    CheckpointUsageError,
    UnsafeCheckpointError,
)

__all__ = [
    "CheckpointDeviceError",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointKeyError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointRankError",
    "CheckpointUsageError",
    "UnsafeCheckpointError",
]
