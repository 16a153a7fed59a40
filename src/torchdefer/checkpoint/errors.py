"""Errors raised while loading a checkpoint; each keeps the built-in type callers expect.

Every message names the file (and the member or key), says what is wrong and
what to do. ``except torchdefer.TorchdeferError`` catches them all; the
built-in base (``ValueError``, ``KeyError``, ...) keeps older ``except``
clauses working. A load that raises one of these changed nothing in the model.
"""

from __future__ import annotations

import pickle

from torchdefer.errors import TorchdeferError

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


class CheckpointError(TorchdeferError):
    """Base class of the errors :func:`torchdefer.load_state_dict` raises."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The path, a shard the index names, or a DCP data file does not exist."""


class CheckpointFormatError(CheckpointError, ValueError):
    """A file is damaged or not in the format its name or contents claim."""


class UnsafeCheckpointError(CheckpointError, pickle.UnpicklingError):
    """A file asks to run code (a pickle global outside the allowlist) or to read
    outside its directory; refused before anything ran."""


class CheckpointKeyError(CheckpointError, KeyError):
    """``strict=True`` and keys are missing or unexpected, or nothing matches at all."""

    def __str__(self) -> str:  # KeyError's str() would quote the whole message
        return str(self.args[0]) if self.args else ""


class CheckpointMismatchError(CheckpointError, ValueError):
    """The checkpoint does not fit the module: a shape, a tie, a non-tensor entry."""


class CheckpointDeviceError(CheckpointError, RuntimeError):
    """A tensor's device is not available in this process."""


class CheckpointUsageError(CheckpointError, TypeError):
    """The arguments cannot be honoured for this module or source."""


class CheckpointRankError(CheckpointError, RuntimeError):
    """A sharded load failed on another rank; this rank refused it too, unchanged."""
