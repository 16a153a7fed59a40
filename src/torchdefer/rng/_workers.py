"""Threads kept between split calls, and running pieces on them and on the caller.

A split call used to start a thread pool of its own: ~0.3 ms per call, paid
by each of a model's ~80 large fills. The threads are kept instead (idle
ones cost nothing), and the calling thread draws the first piece itself
rather than waiting idle. A process forked after a draw (a ``fork``
DataLoader worker) has none of the parent's threads: it starts its own.

The kept threads run only inside :func:`run_pieces`, which returns after all
its pieces ended; :func:`kept_threads` counts them, so that a recording can
tell them from threads that may draw while it records (``recorder._rng_placement``).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

__all__ = ["kept_threads", "run_pieces"]

T = TypeVar("T")


class _Workers:
    """A thread pool grown to the most pieces asked for at once; forgotten in a fork."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._size = 0
        # Every thread a pool of ours started (marked as it starts, before any piece).
        self.threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()

    def pool(self, size: int) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._size < size:
                old, self._pool, self._size = self._pool, ThreadPoolExecutor(
                    size, "torchdefer-draw", initializer=self._mark), size
                if old is not None:
                    old.shutdown(wait=False)  # its running pieces finish; then its threads end
            return self._pool

    def _mark(self) -> None:
        self.threads.add(threading.current_thread())

    def forget(self) -> None:
        """In a forked child: the pool's threads were not copied, so never use it."""
        self._lock = threading.Lock()
        self._pool, self._size = None, 0


_WORKERS = _Workers()
os.register_at_fork(after_in_child=_WORKERS.forget)


def kept_threads() -> int:
    """How many threads torchdefer keeps for split draws are alive now (idle unless a
    :func:`run_pieces` call, made by some other thread, is running)."""
    return sum(t.is_alive() for t in list(_WORKERS.threads))


def run_pieces(pieces: Sequence[Callable[[], T]]) -> list[T]:
    """Each of ``pieces`` called once, the first on this thread, the others on kept
    threads; their results in order. Returns (or raises the first failure) only
    after every piece has ended: none runs on after a failure is raised."""
    if len(pieces) == 1:
        return [pieces[0]()]
    pool = _WORKERS.pool(len(pieces) - 1)
    futures: list[Future[T]] = [pool.submit(piece) for piece in pieces[1:]]
    try:
        first = pieces[0]()
    finally:
        wait(futures)
    return [first, *(f.result() for f in futures)]
