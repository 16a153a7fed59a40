"""Errors raised while recording."""

from __future__ import annotations

__all__ = ["RecordingError"]


class RecordingError(RuntimeError):
    """An op could not be recorded faithfully; the message says why and what to do."""
