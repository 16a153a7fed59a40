"""Errors raised while materializing."""

from __future__ import annotations

__all__ = ["DeviceUnavailableError", "ExternalTensorModifiedError", "ReplayError"]


class ReplayError(RuntimeError):
    """Replaying a recorded op failed; the message names the op and where it was recorded."""


class DeviceUnavailableError(ReplayError):
    """A tensor was recorded on a device this process does not have."""


class ExternalTensorModifiedError(ReplayError):
    """A real tensor used during recording was changed before materialization."""
