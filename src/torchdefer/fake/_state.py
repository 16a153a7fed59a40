"""Per-thread dispatch state shared by the fake-tensor modules."""

from __future__ import annotations

import threading

__all__ = ["STATE"]


class _State(threading.local):
    # While a meta kernel runs, fake tensors must say "meta" so that kernels
    # pick the meta implementation; everywhere else they report their device.
    in_kernel: bool = False
    # Inside a Python binding that takes a device guard (see _calls.GUARDED),
    # tensors on a device this host lacks report the CPU.
    guarded: bool = False


STATE = _State()
