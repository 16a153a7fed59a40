"""Map a checkpoint's file pages into the process while the load does its other work.

safetensors hands out tensors that are views of the file mapped into memory;
their pages are mapped one fault at a time when first read (by the first
forward pass, or by whoever reads the weights). Asking the kernel to map them
all at once (``madvise(MADV_POPULATE_READ)``, Linux 5.14+) is faster than
faulting them in, and a thread can ask while the loader validates, prepares
and replays (``madvise`` runs without the GIL). Nothing is copied: the
pages are the page cache's, as a read would map them; RSS ends where reading
every weight once would leave it.

The tensors of one file lie end to end in its mapping, so they are asked for
as a few long ranges (merged), in pieces of ``_PIECE`` bytes: a load that is
refused stops the thread after the piece it is on (:meth:`PageMapper.cancel`)
rather than mapping the rest of a file it will not use. The thread holds the
storages, so their mappings outlive it whatever the caller drops.

Elsewhere (another OS, an older kernel, a tensor not backed by a file) this
does nothing: the pages are then mapped when read, as before.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Iterable

import torch

__all__ = ["PageMapper", "map_pages"]

_MADV_POPULATE_READ = 22  # linux/mman.h (Linux 5.14)
_PAGE = 4096
_PIECE = 64 << 20  # bytes per madvise call: a cancel waits for at most one piece


class PageMapper:
    """The thread mapping pages (or nothing): :meth:`wait` for it, :meth:`cancel` it."""

    def __init__(self, spans: list[tuple[int, int]], keep: list) -> None:
        self._stop = threading.Event()
        madvise = _madvise() if spans else None
        self._thread = None if madvise is None else threading.Thread(
            target=_populate, args=(madvise, spans, keep, self._stop),
            name="torchdefer-map-pages", daemon=True)
        if self._thread is not None:
            self._thread.start()

    def wait(self) -> None:
        """Return once every page is mapped (or the thread stopped)."""
        if self._thread is not None:
            self._thread.join()

    def cancel(self) -> None:
        """Stop after the current piece, and wait for that."""
        self._stop.set()
        self.wait()


def map_pages(tensors: Iterable[torch.Tensor]) -> PageMapper:
    """Start mapping the pages behind CPU ``tensors``; returns the :class:`PageMapper`.

    >>> mapper = map_pages([torch.ones(4)])
    >>> mapper.wait()
    """
    storages = [t.untyped_storage() for t in tensors if t.device.type == "cpu"]
    spans = _merged([(s.data_ptr(), s.nbytes()) for s in storages if s.nbytes() >= _PAGE])
    return PageMapper(spans, storages)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Page-aligned ``(start, end)`` ranges covering ``spans``, touching ones joined
    (never across a hole: madvise stops at an address that is not mapped)."""
    out: list[tuple[int, int]] = []
    for address, nbytes in sorted(spans):
        start = address & ~(_PAGE - 1)
        end = (address + nbytes + _PAGE - 1) & ~(_PAGE - 1)
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _populate(madvise, spans: list[tuple[int, int]], keep: list,
              stop: threading.Event) -> None:
    for start, end in spans:
        for piece in range(start, end, _PIECE):
            if stop.is_set():
                return
            if madvise(piece, min(_PIECE, end - piece), _MADV_POPULATE_READ) != 0:
                return  # EINVAL: a kernel without it; anything else: the pages map when read
    del keep  # the mappings may go once the thread is done


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
