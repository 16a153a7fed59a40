"""Resident memory of this process, and its peak over a phase.

The parent samples the child's RSS with psutil (see ``runner.py``), which can
miss a spike shorter than the sampling period. On Linux the kernel also keeps
the exact high-water mark (``VmHWM``) and lets a process reset it (writing
``5`` to ``/proc/self/clear_refs``), so each phase's peak is read exactly when
the platform allows; the report takes the larger of the two.
"""

from __future__ import annotations

import gc
import os

import psutil

__all__ = ["PeakMeter", "rss"]

_PROCESS: psutil.Process | None = None


def rss() -> int:
    """Resident set size of this process, in bytes."""
    global _PROCESS
    # A forked child must not read its parent's numbers through a cached handle.
    if _PROCESS is None or _PROCESS.pid != os.getpid():
        _PROCESS = psutil.Process(os.getpid())
    return _PROCESS.memory_info().rss


class PeakMeter:
    """The exact peak RSS of this process since :meth:`reset`, where Linux allows it."""

    def __init__(self) -> None:
        self.exact = self._reset_hwm()

    def reset(self, collect: bool = True) -> int:
        """Collect garbage (unless told not to), start a new peak; returns the RSS now."""
        if collect:
            gc.collect()
        self.exact = self._reset_hwm()
        return rss()

    def peak(self) -> int | None:
        """Peak RSS since the last reset, or None where the kernel does not tell."""
        if not self.exact:
            return None
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False
