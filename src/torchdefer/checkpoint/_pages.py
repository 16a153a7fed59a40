"""Map a checkpoint's file pages into the process while the load does its other work.

safetensors hands out tensors that are views of the file mapped into memory;
their pages are mapped one fault at a time when first read (by the first
forward pass, or by whoever reads the weights). A thread can take those
faults instead, while the loader validates, prepares and replays: it reads
one byte per ``_STEP`` bytes of every tensor, and Linux maps the cached
pages around each fault with it (``fault_around_bytes``, 64 KiB by default),
so 2.3 GiB are mapped in ~6 ms. Nothing is copied: the pages are the page
cache's, as a read would map them; RSS ends where reading every weight once
would leave it. Where the kernel maps less around a fault (another OS, a
smaller ``fault_around_bytes``, a cold page cache), the pages not mapped are
mapped when first read, as before: only the speed differs, never a value.

Why reading rather than ``madvise(MADV_POPULATE_READ)`` (Linux 5.14+): that
walks every 4 KiB page on its own and took 12-14 ms for the same 2.3 GiB on
the machine ``bench/bench_checkpoint_load.py`` ran on, more than the faults
it saves; and each call hands the GIL back and forth with the loader.

The reads are one torch call per piece of ``_PIECE`` bytes (the GIL is
released inside): a load that is refused stops the thread after the piece it
is on (:meth:`PageMapper.cancel`) rather than reading the rest of a file it
will not use. The thread holds the storages, so their mappings outlive it
whatever the caller drops. A file truncated by another process after it was
opened makes the read fault (SIGBUS), as the first forward pass would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch

from torchdefer.recorder._mode import suspended

__all__ = ["PageMapper", "map_pages"]

_STEP = 64 << 10  # Linux's default fault_around_bytes: one read maps this much
_PIECE = 4 << 30  # bytes per call: a cancel waits for at most one piece (~10 ms)


class PageMapper:
    """The thread mapping pages (or nothing): :meth:`wait` for it, :meth:`cancel` it."""

    def __init__(self, pieces: list[list[torch.Tensor]]) -> None:
        self._stop = threading.Event()
        self.pieces = pieces  # the reads: one view per tensor, grouped by call
        self._thread = None if not pieces else threading.Thread(
            target=_read, args=(pieces, self._stop), name="torchdefer-map-pages", daemon=True)
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
    pieces: list[list[torch.Tensor]] = []
    size = _PIECE
    with suspended():  # real reads, also when a load runs inside deferred_init
        for t in tensors:
            if t.device.type != "cpu" or t.numel() == 0:
                continue
            storage = t.untyped_storage()
            nbytes = storage.nbytes()
            if nbytes == 0:
                continue
            if size + nbytes > _PIECE:
                pieces.append([])
                size = 0
            size += nbytes
            pieces[-1].append(_touch(storage, nbytes))
    return PageMapper(pieces)


def _touch(storage: torch.UntypedStorage, nbytes: int) -> torch.Tensor:
    """One byte per ``_STEP`` of ``storage``, ending with its last byte. Its first
    window may be left when the storage starts off a ``_STEP`` boundary: in a
    checkpoint file that is the window of the tensor before it, read with it."""
    first = (nbytes - 1) % _STEP
    return torch.empty(0, dtype=torch.uint8, device="cpu").set_(
        storage, first, ((nbytes - 1) // _STEP + 1,), (_STEP,))


def _read(pieces: list[list[torch.Tensor]], stop: threading.Event) -> None:
    with torch.no_grad():
        for piece in pieces:
            if stop.is_set():
                return
            try:
                torch.cat(piece)  # reads every byte listed, in C++ without the GIL
            except Exception:  # only the speed is at stake: the pages map when read
                return
