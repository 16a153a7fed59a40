"""Errors raised while recording (defined in :mod:`torchdefer.errors`, re-exported here)."""

from __future__ import annotations

from torchdefer.errors import EagerRefusalError, RecordingError

__all__ = ["EagerRefusalError", "RecordingError"]
