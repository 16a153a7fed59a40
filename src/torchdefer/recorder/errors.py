"""Errors raised while recording."""

from __future__ import annotations

from torchdefer.errors import TorchdeferError

__all__ = ["RecordingError"]


class RecordingError(TorchdeferError, RuntimeError):
    """An op could not be recorded faithfully; the message says why and what to do."""
