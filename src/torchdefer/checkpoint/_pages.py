"""Map a checkpoint's file pages into the process while the load does its other work.

safetensors hands out tensors that are views of the file mapped into memory;
their pages are mapped one fault at a time when first read (by the first
forward pass, or by whoever reads the weights). Asking the kernel to map them
all at once (``madvise(MADV_POPULATE_READ)``, Linux 5.14+) is faster than
faulting them in, and a thread can ask while the loader validates, prepares
and replays (``madvise`` runs without the GIL). Nothing is copied: the
pages are the page cache's, as a read would map them; RSS ends where reading
every weight once would leave it.

Elsewhere (another OS, an older kernel, a tensor not backed by a file) this
does nothing: the pages are then mapped when read, as before.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable, Iterable

import torch

__all__ = ["map_pages"]

_MADV_POPULATE_READ = 22  # linux/mman.h (Linux 5.14)
_PAGE = 4096


def map_pages(tensors: Iterable[torch.Tensor]) -> Callable[[], None]:
    """Start mapping the pages behind CPU ``tensors``; returns what waits for it.

    >>> wait = map_pages([torch.ones(4)])
    >>> wait()
    """
    madvise = _madvise()
    storages = [t.untyped_storage() for t in tensors if t.device.type == "cpu"]
    spans = [(s.data_ptr(), s.nbytes()) for s in storages if s.nbytes() >= _PAGE]
    if madvise is None or not spans:
        return _nothing
    thread = threading.Thread(target=_populate, args=(madvise, spans),
                              name="torchdefer-map-pages", daemon=True)
    thread.start()
    return thread.join


def _populate(madvise, spans: list[tuple[int, int]]) -> None:
    for address, nbytes in spans:
        start = address & ~(_PAGE - 1)
        if madvise(start, address + nbytes - start, _MADV_POPULATE_READ) != 0:
            return  # EINVAL: a kernel without it; anything else: the pages map when read


def _nothing() -> None:
    pass


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function
