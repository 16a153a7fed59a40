"""Independent tensors replayed side by side: the other half of ``threads=``.

``materialize_module(model, threads=N)`` replays each large random fill in up
to ``N`` chunks (:mod:`torchdefer.materialize.parallel`); the many small
tensors of a model (norms, biases, small layers) are replayed concurrently
instead, up to ``N`` at a time, each on a worker thread and drawn whole. What
serializes them otherwise is their fixed cost (the replay's Python, a jump
ahead, the kernels' launch), of which torch's kernels and the jumps release
the GIL. The results are swapped in on the caller's thread, in the order the
serial path uses, so the bits, the progress events and a failure's outcome
are the serial path's.

Which tensor runs where (the rule the docs state):

* **Alone, on the caller**, after every tensor before it is done: one that
  splits into chunks (at least two chunks' worth of elements: the chunks use
  the threads), one replayed on a device other than the CPU (a CUDA replay
  borrows the device's one default generator, under a lock) or on meta, and
  one whose replay meets a node recorded under other process-wide settings
  than the caller's (a default dtype, deterministic mode, matmul precision:
  ``recorder.ambient``; switching them would change what the other threads
  compute). That last kind is found while it replays on a worker: the replay
  stops there (nothing of it is kept but exact values), the workers finish,
  and it runs again alone.
* **After** the tensor before it that shares its storage (a view of it,
  ``set_`` onto it): it must be rebuilt over that tensor's real storage.
* **Memory budget:** a tensor starts only if its bytes (as replayed, before
  ``dtype=``) plus those of the tensors started and not yet handed back fit
  the budget; the first one in flight always starts. The default budget is
  the largest tensor's bytes: what the serial path holds of a replay at its
  peak, so the peak stays the serial path's.

Errors: the first failure in the serial order is raised on the caller's
thread (with the replay's what and where), after every tensor before it was
handed back (and swapped in by ``materialize_module``); tensors not started
are cancelled, the running ones end, and none of their results is used, so
the module is left as the serial path leaves it on that error. A running
tensor's replay is not interrupted: it ends, and is thrown away.

Not concurrent: ``materialize_tensor`` (one tensor), checkpoint loads (all or
nothing), sharded ranks (whose rows split on threads already).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch

from torchdefer.errors import InternalError
from torchdefer.materialize import parallel
from torchdefer.recorder.ambient import Ambient, current_ambient

__all__ = ["SMALL", "Job", "NeedsAlone", "budget", "check_ambient", "is_alone", "is_small",
           "on_worker", "replayed_in_order"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One tensor to replay: what the scheduler reads of it."""

    index: int  # its place in the serial order
    nbytes: int  # its bytes as replayed (recorded dtype)
    storage: tuple[int, int]  # (id(graph), id(storage record)): who must wait for whom
    alone: bool  # split into chunks, not on the CPU: runs alone on the caller
    # Too small to gain from a thread (its replay is Python, which holds the
    # GIL): runs on the caller, in its turn, beside the workers' jobs.
    small: bool = False


# The budget of bytes in flight, when set (tests and benchmarks); None: the largest job's.
_budget: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "torchdefer_concurrent_budget", default=None
)
# Whether this thread replays one of several tensors at once (a worker of this module).
_worker: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "torchdefer_concurrent_worker", default=False
)


@contextlib.contextmanager
def budget(nbytes: int) -> Iterator[None]:
    """Let at most ``nbytes`` of tensors be in flight at once (the first always starts)."""
    token = _budget.set(nbytes)
    try:
        yield
    finally:
        _budget.reset(token)


def on_worker() -> bool:
    """Whether this replay runs beside others (:func:`check_ambient` applies)."""
    return _worker.get()


class NeedsAlone(BaseException):
    """A worker's replay met a node that needs other process-wide settings.

    A signal between threads, never raised to users; a BaseException so that
    no ``except Exception`` on the way (replay's error context, a probe's
    fallback) wraps or swallows it: the scheduler takes it.
    """


def check_ambient(ambient: Ambient | None) -> None:
    """On a worker, refuse a node recorded under other process-wide settings than now.

    Inference mode is per thread, and the replay switches it on its own
    thread; the other settings of :class:`~torchdefer.recorder.ambient.Ambient`
    are the process's: a worker must not switch them under the others.
    """
    if ambient is None:
        return
    now = current_ambient()
    if ambient is now:
        return
    if _process_wide(ambient) != _process_wide(now):
        raise NeedsAlone


def _process_wide(a: Ambient) -> tuple[Any, ...]:
    return (a.default_dtype, a.deterministic, a.warn_only, a.fill_uninitialized_memory,
            a.float32_matmul_precision)


def is_alone(numel: int, device: torch.device, threads: int) -> bool:
    """Whether a tensor of ``numel`` elements replayed on ``device`` runs alone."""
    return device.type != "cpu" or (threads > 1 and numel >= 2 * parallel.chunk_floor())


# Below this many elements a tensor's replay is mostly Python (~0.3 ms a tensor,
# against ~2.5 ns an element of normal_): on a worker it would only wait for
# the GIL, so it runs on the caller, between taking the workers' results.
SMALL = 1 << 16


def is_small(numel: int) -> bool:
    """Whether a tensor of ``numel`` elements replays on the caller, not on a worker."""
    return numel < SMALL


def replayed_in_order(
    jobs: Sequence[Job], run: Callable[[Job], torch.Tensor], threads: int,
) -> Generator[tuple[Job, torch.Tensor], None, None]:
    """``(job, run(job))`` for each of ``jobs`` in order; up to ``threads`` run at once.

    See the module docstring for which run together. ``run`` is called on the
    caller's thread for jobs that run alone or are small, on a worker thread for
    the others (in a copy of the caller's context); beside others, with
    ``threads=1`` for its draws.
    """
    if threads < 2 or not any(not j.alone and not j.small for j in jobs):
        for job in jobs:
            yield job, run(job)
        return
    limit = _budget.get()
    if limit is None:
        limit = max(j.nbytes for j in jobs)
    with ThreadPoolExecutor(threads, "torchdefer-replay") as pool:
        flight = _Flight(jobs, run, pool, limit)
        try:
            for job in jobs:
                flight.fill()
                yield job, flight.take(job)
        finally:
            flight.stop()


class _Flight:
    """The jobs started and not yet handed back, in order (one scheduler's state)."""

    def __init__(self, jobs: Sequence[Job], run: Callable[[Job], torch.Tensor],
                 pool: ThreadPoolExecutor, limit: int) -> None:
        self.jobs, self.run, self.pool, self.limit = jobs, run, pool, limit
        self.next = 0  # the first job not started
        self.futures: dict[int, Future[torch.Tensor]] = {}
        self.on_caller: set[int] = set()  # small jobs started: run when taken
        self.bytes = 0
        self.storages: dict[tuple[int, int], int] = {}  # storage -> jobs in flight over it

    def fill(self) -> None:
        """Start jobs in order while they may start (module docstring)."""
        while self.next < len(self.jobs):
            job = self.jobs[self.next]
            if job.alone or job.storage in self.storages:
                return
            if (self.futures or self.on_caller) and self.bytes + job.nbytes > self.limit:
                return
            if job.small:
                self.on_caller.add(job.index)
            else:
                context = contextvars.copy_context()  # one each: a context runs on one thread
                self.futures[job.index] = self.pool.submit(context.run, self._beside, job)
            self.bytes += job.nbytes
            self.storages[job.storage] = self.storages.get(job.storage, 0) + 1
            self.next += 1

    def _beside(self, job: Job) -> torch.Tensor:
        """``run(job)`` beside other jobs (a worker, or the caller for a small one)."""
        token = _worker.set(True)
        try:
            with parallel.threads_used(1):  # the threads run tensors, not chunks
                return self.run(job)
        finally:
            _worker.reset(token)

    def take(self, job: Job) -> torch.Tensor:
        """``job``'s tensor: waited for, run here when small, or alone."""
        future = self.futures.pop(job.index, None)
        if future is None and job.index not in self.on_caller:
            if self.futures or self.on_caller or self.next != job.index:
                raise InternalError("concurrent replay: a job to run alone with others in "
                                    "flight; this is a bug in torchdefer, please report it")
            self.next += 1
            return self.run(job)
        try:
            try:
                if future is None:
                    self.on_caller.discard(job.index)
                    return self._beside(job)
                return future.result()
            except NeedsAlone:
                wait(list(self.futures.values()))  # the process-wide settings are ours now
                return self.run(job)
        finally:
            self.bytes -= job.nbytes
            left = self.storages.pop(job.storage) - 1
            if left:
                self.storages[job.storage] = left

    def stop(self) -> None:
        """After a failure (or the caller stopping): start nothing more, let the running
        jobs end, drop what they give."""
        self.next = len(self.jobs)
        self.on_caller.clear()
        for future in self.futures.values():
            future.cancel()
        wait(list(self.futures.values()))
        self.futures.clear()
