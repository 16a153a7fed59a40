"""Make tensors on the calling thread while one writer thread writes the earlier ones.

Replaying a tensor and writing one both spend their time in code that releases
the GIL (torch kernels, ``write(2)``), so the two overlap on two cores. The
bytes in flight (made, not yet written) are bounded: a tensor is made only
when it fits, with what the writer still holds, in ``budget`` bytes; a tensor
bigger than that waits until the writer holds nothing. With ``budget`` = the
largest tensor plus some slack, peak memory stays the largest tensor plus the
slack (plus the intermediates of one replay).

Progress is reported on the calling thread (a callback never runs on the
writer thread). An error on either side stops both and is raised on the
calling thread.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import torch

from torchdefer.checkpoint._write_plan import Entry
from torchdefer.errors import InternalError
from torchdefer.materialize.progress import Progress

__all__ = ["Aborted", "Pipeline"]


class Aborted(Exception):
    """The making side failed; the writer stops without writing more."""


_END = object()


class Pipeline:
    """One run: ``run(entries, make, writer)``; the writer calls ``take``/``done``.

    ``make(entry)`` returns the tensor to write (on the calling thread).
    ``writer()`` runs on the writer thread; it calls :meth:`take` for each
    entry in order and :meth:`done` once it no longer needs the tensor.
    """

    def __init__(self, budget: int, bar: Progress) -> None:
        self._budget = budget
        self._bar = bar
        self._cond = threading.Condition()
        self._queue: deque[Any] = deque()
        self._held: dict[int, int] = {}  # id(entry) -> bytes counted for it
        self._finished: list[Entry] = []  # written, not yet reported
        self._error: BaseException | None = None
        self._writer_exited = False
        self._making_failed = False

    def run(self, entries: Iterable[Entry], make: Callable[[Entry], torch.Tensor],
            writer: Callable[[], None]) -> None:
        thread = threading.Thread(target=self._write, args=(writer,),
                                  name="torchdefer-writer", daemon=True)
        thread.start()
        try:
            for entry in entries:
                self._wait_for_room(entry.source_nbytes)
                tensor = make(entry)
                with self._cond:
                    self._held[id(entry)] = entry.source_nbytes
                    self._queue.append((entry, tensor))
                    self._cond.notify_all()
                del tensor
                self._report()
        except BaseException:
            with self._cond:
                self._making_failed = True
                self._queue.append(_END)
                self._cond.notify_all()
            thread.join()
            raise
        with self._cond:
            self._queue.append(_END)
            self._cond.notify_all()
        while thread.is_alive():
            thread.join(0.1)
            self._report()
        self._report()
        if self._error is not None:
            raise self._error
        if list(self._queue) != [_END]:  # never a checkpoint with tensors left out
            raise InternalError("torchdefer's checkpoint writer finished without writing "
                               f"{len(self._queue) - 1} tensor(s); this is a bug, please "
                               "report it.")

    def take(self) -> tuple[Entry, torch.Tensor]:
        """The next entry and its tensor (writer thread); raises :class:`Aborted`."""
        with self._cond:
            while not self._queue:
                self._cond.wait()
            item = self._queue.popleft()
            if item is _END:
                self._queue.appendleft(item)
                raise Aborted("the tensors to write could not all be made")
            return item

    def done(self, entry: Entry) -> None:
        """The writer no longer holds ``entry``'s tensor."""
        with self._cond:
            self._held.pop(id(entry), None)
            self._finished.append(entry)
            self._cond.notify_all()

    def _write(self, writer: Callable[[], None]) -> None:
        try:
            writer()
        except Aborted:
            with self._cond:
                if not self._making_failed:  # the writer wanted more than was made
                    self._error = InternalError(
                        "torchdefer's checkpoint writer expected more tensors than were "
                        "made; this is a bug, please report it.")
        except BaseException as e:  # handed to the calling thread
            with self._cond:
                self._error = e
        finally:
            with self._cond:
                self._writer_exited = True
                self._cond.notify_all()

    def _wait_for_room(self, nbytes: int) -> None:
        while True:
            with self._cond:
                if self._error is not None:
                    raise self._error
                held = sum(self._held.values())
                if held == 0 or held + nbytes <= self._budget:
                    return
                if self._writer_exited:  # a writer that stopped early: never wait forever
                    raise InternalError("torchdefer's checkpoint writer thread stopped before "
                                       "writing every tensor; this is a bug, please report it.")
                self._cond.wait(0.1)
            self._report()

    def _report(self) -> None:
        with self._cond:
            finished, self._finished = self._finished, []
        for entry in finished:  # outside the lock: a callback may take its time
            self._bar.advance(entry.name, entry.nbytes)
