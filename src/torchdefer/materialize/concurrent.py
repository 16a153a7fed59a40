"""Independent tensors replayed side by side: the other half of ``threads=``.

On whenever ``threads`` > 1 (:func:`budget` ``(0)`` turns it off): bit for
bit at every thread count; on a quiet 2-core machine a Llama 125M took 0.79x
the time of one tensor at a time, on the same machine busy with other work
it was slower (``docs/DECISIONS.md``).

``materialize_module(model, threads=N)`` replays each large random fill in up
to ``N`` chunks (:mod:`torchdefer.materialize._parallel`); the tensors too
small to split (norms, biases, a 125M model's projections) are replayed on
up to ``N`` worker threads at once, each drawn whole. The results are
swapped in on the caller's thread, in the order the serial path uses, so the
bits, the progress events and a failure's outcome are the serial path's.

How (``_Flight``): a *window* of consecutive tensors that fits the memory
budget is cut into up to ``N`` *runs* of consecutive tensors of about equal
bytes, each replayed in order by one worker. In order, because a random
tensor starts where the one before it in its stream ended: the next one in
a run starts from the state the last one left, while a tensor started before
the one before it ended must first reach its start (drawing that one's
words, about 3/4 of its cost, or a jump). A run pays that once, for its
first tensor. The next window starts once this one is all handed back.
Workers keep the caller's intra-op threads (``torch.get_num_threads()``):
some kernels' bits depend on it (LAPACK's QR in ``orthogonal_``, parallel
sums), and the setting is process-wide, so no worker changes it, not even
for a jump (``mt19937.intra_op_shared``). The cost: N workers may each start
a team of intra-op threads.

Which tensor runs where (the rule the docs state):

* **Alone, on the caller**, after every tensor before it is done: one that
  splits into chunks (at least two chunks' worth of elements: the chunks use
  the threads), one replayed on a device other than the CPU (a CUDA replay
  borrows the device's one default generator, under a lock) or on meta, and
  one whose replay meets a node recorded under other process-wide settings
  than the caller's (a default dtype, deterministic mode, matmul precision:
  ``recorder._ambient``; switching them would change what the other threads
  compute). That last kind is found while it replays on a worker: the replay
  stops there (nothing of it is kept but exact values), the workers finish,
  and it runs again alone.
* **In a later window** than a tensor that shares its storage (a view of it,
  ``set_`` onto it): it must be rebuilt over that tensor's real storage.
* **Memory budget:** a window holds consecutive tensors while their bytes (as
  replayed, before ``dtype=``) fit the budget (a window of one tensor runs on
  the caller). By default a quarter of all the tensors' bytes, or the largest
  tensor's if more. Why that bounds the peak: the results a window holds
  before their turn are tensors the module holds at the end anyway, and the
  peak (the serial path's too) is at the end; what side by side adds is the
  working memory of the replays running at once (up to ``N``, each of a
  tensor below the split size), where the serial path has one's.

Errors: the first failure in the serial order is raised on the caller's
thread (with the replay's what and where), after every tensor before it was
handed back (and swapped in by ``materialize_module``); the runs stop (a run
skips what follows its own failure), the running replays end, and none of
their results is used, so the module is left as the serial path leaves it
on that error. A running tensor's replay is not interrupted: it ends, and is
thrown away.

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
from torchdefer.materialize import _parallel as parallel
from torchdefer.recorder._ambient import Ambient, current_ambient
from torchdefer.rng import mt19937

__all__ = ["Job", "NeedsAlone", "budget", "check_ambient", "is_alone", "on_worker",
           "replayed_in_order", "side_by_side"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One tensor to replay: what the scheduler reads of it."""

    index: int  # its place in the serial order
    nbytes: int  # its bytes as replayed (recorded dtype)
    storage: tuple[int, int]  # (id(graph), id(storage record)): who must wait for whom
    alone: bool  # split into chunks, not on the CPU: runs alone on the caller


# The bytes a window may hold; None: the default rule (a quarter of all the
# jobs' bytes, or the largest job's if more; the default); 0: side by side is
# off, every tensor replays on the caller in turn (see budget).
_budget: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "torchdefer_concurrent_budget", default=None
)
# Whether this thread replays one of several tensors at once (a worker of this module).
_worker: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "torchdefer_concurrent_worker", default=False
)


@contextlib.contextmanager
def side_by_side(nbytes: int | None = None) -> Iterator[None]:
    """Tensors side by side for ``materialize_module(threads=N)`` in this block.

    The default already (it was an opt-in experiment); kept so that code
    written for it keeps working, and to give ``nbytes``: the window budget
    (None: the default rule above).

    >>> import torch, torchdefer
    >>> from torchdefer.materialize import concurrent
    >>> layers = lambda: torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(4)))
    >>> m = torchdefer.deferred_init(layers)
    >>> with concurrent.side_by_side():
    ...     _ = torchdefer.materialize_module(m, threads=2)
    >>> torchdefer.is_deferred(m)
    False
    """
    token = _budget.set(nbytes)
    try:
        yield
    finally:
        _budget.reset(token)


@contextlib.contextmanager
def budget(nbytes: int) -> Iterator[None]:
    """Let a window hold at most ``nbytes`` of tensors (``0``: one tensor at a time, on
    the caller, as with one thread; a tensor over the budget runs by itself)."""
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
    thread; the other settings of :class:`~torchdefer.recorder._ambient.Ambient`
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


def replayed_in_order(
    jobs: Sequence[Job], run: Callable[[Job], torch.Tensor], threads: int,
) -> Generator[tuple[Job, torch.Tensor], None, None]:
    """``(job, run(job))`` for each of ``jobs`` in order; up to ``threads`` run at once.

    See the module docstring for which run together. ``run`` is called on the
    caller's thread for jobs that run alone, on a worker thread for the others
    (in a copy of the caller's context, with ``threads=1`` for its draws).
    """
    limit = _budget.get()
    if threads < 2 or limit == 0 or sum(not j.alone for j in jobs) < 2:
        for job in jobs:
            yield job, run(job)
        return
    if limit is None:
        limit = max(max(j.nbytes for j in jobs), sum(j.nbytes for j in jobs) // 4)
    with ThreadPoolExecutor(threads, "torchdefer-replay") as pool:
        flight = _Flight(jobs, run, pool, limit, threads)
        try:
            for job in jobs:
                flight.fill()
                yield job, flight.take(job)
        finally:
            flight.stop()


class _Flight:
    """The jobs started and not yet handed back, in order (one scheduler's state).

    Jobs start a window at a time: the consecutive jobs from the first not
    started that fit the budget, cut into up to ``threads`` runs of
    consecutive jobs, each run replayed in order by one worker. In order,
    because a random tensor starts where the one before it in its stream
    ended: a worker replaying the next one then starts from the state the
    last one left, while a tensor started before the one before it ended
    must first reach its start (drawing the words of that one, ~3/4 of its
    cost). So each run pays that once, for its first tensor (a jump), not
    each tensor.
    """

    def __init__(self, jobs: Sequence[Job], run: Callable[[Job], torch.Tensor],
                 pool: ThreadPoolExecutor, limit: int, threads: int) -> None:
        self.jobs, self.run, self.pool, self.limit = jobs, run, pool, limit
        self.threads = threads
        self.next = 0  # the first job not started
        self.futures: dict[int, Future[torch.Tensor]] = {}
        self.stopping = False

    def fill(self) -> None:
        """Start the next window when the last one is all handed back."""
        if self.futures or self.stopping:
            return
        window: list[Job] = []
        nbytes, storages = 0, set()
        for job in self.jobs[self.next:]:
            if job.alone or job.storage in storages:
                break  # alone: on the caller; a shared storage: in a later window
            if window and nbytes + job.nbytes > self.limit:
                break
            window.append(job)
            nbytes += job.nbytes
            storages.add(job.storage)
        if len(window) < 2:
            return  # one job: the caller runs it (take)
        self.next += len(window)
        for part in _runs(window, self.threads):
            futures = [Future[torch.Tensor]() for _ in part]
            self.futures.update(zip((j.index for j in part), futures))
            context = contextvars.copy_context()  # one each: a context runs on one thread
            self.pool.submit(context.run, self._run_in_order, part, futures)

    def _run_in_order(self, part: list[Job], futures: list[Future[torch.Tensor]]) -> None:
        """On a worker: each job of ``part`` in turn, beside the other workers."""
        _worker.set(True)
        failed = False  # the jobs after a failure are never used: skip them
        # The threads run tensors, not chunks; and a jump must not set the
        # process's intra-op threads to 1 under another worker's kernel.
        with parallel.threads_used(1), mt19937.intra_op_shared():
            for job, future in zip(part, futures):
                if self.stopping or failed:
                    future.cancel()
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(self.run(job))
                except NeedsAlone as signal:  # the caller runs it again alone; go on
                    future.set_exception(signal)
                except BaseException as error:  # handed to the caller by take
                    future.set_exception(error)
                    failed = True

    def take(self, job: Job) -> torch.Tensor:
        """``job``'s tensor: waited for, or run here when it is not in a window."""
        future = self.futures.pop(job.index, None)
        if future is None:
            if self.futures or self.next != job.index:
                raise InternalError("concurrent replay: a job to run alone with others in "
                                    "flight; this is a bug in torchdefer, please report it")
            self.next += 1
            return self.run(job)
        try:
            return future.result()
        except NeedsAlone:
            wait(list(self.futures.values()))  # the process-wide settings are ours now
            return self.run(job)

    def stop(self) -> None:
        """After a failure (or the caller stopping): start nothing more, let the running
        jobs end, drop what they give."""
        self.stopping = True
        for future in self.futures.values():
            future.cancel()
        wait(list(self.futures.values()))
        self.futures.clear()


def _runs(window: list[Job], threads: int) -> list[list[Job]]:
    """``window`` cut into up to ``threads`` runs of consecutive jobs, of about equal bytes."""
    total = sum(j.nbytes for j in window) or 1
    parts: list[list[Job]] = [[]]
    done = 0
    for job in window:
        if parts[-1] and len(parts) < threads and done >= total * len(parts) / threads:
            parts.append([])
        parts[-1].append(job)
        done += job.nbytes
    return parts
