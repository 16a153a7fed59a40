"""Instruction makers for ambient settings and a second thread (issue 24, classes 1 and 2).

``ambient``: a line of another family run under a setting the user may have
in force (``no_grad``, ``inference_mode``, a ``torch.device`` context, meta
included), or a line that changes a process-wide setting for the rest of the
segment (deterministic mode, the default device). The harness resets those
after every segment in both worlds (:func:`reset_ambient`).

``thread``: a second thread, started and joined on one line, so the program is
sequenced and eager is deterministic: it draws from the global generator or
its own, builds an eager layer, reads the generator state, or changes the
default dtype, while the first thread records.

Materializing under a setting is ``Program.materialize_under``
(:data:`MATERIALIZE_UNDER`): each deferred tensor must come out as recorded,
whatever setting is in force when it is made real.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from context import Ctx
from torchdefer import TorchdeferError
from torchdefer._compat import restore_default_device
from torchdefer.recorder._refusals import EagerRefusalError

__all__ = ["MATERIALIZE_UNDER", "ambient", "attempt", "refused", "reset_ambient", "settings", "stop_worker", "thread",
           "worker"]

_WRAPPERS = ["torch.no_grad()", "torch.inference_mode()", "torch.device('meta')",
             "torch.device('cpu')", "torch.enable_grad()"]
_SETTERS = ["torch.use_deterministic_algorithms(True)",
            "torch.use_deterministic_algorithms(False)",
            "torch.set_default_device('meta')", "torch.set_default_device('cpu')",
            "torch.set_default_device(None)"]
_WRAPPED_FAMILIES = ("factory", "random", "random_on", "inplace", "compute", "view", "module")

MATERIALIZE_UNDER = ("", "", "torch.no_grad()", "torch.inference_mode()", "torch.device('meta')",
                     "torch.device('cuda')", "settings(dtype=torch.float64)",
                     "settings(dtype=torch.bfloat16)", "settings(deterministic=True)",
                     "settings(device='meta')", "settings(device='cuda')")


def ambient(ctx: Ctx) -> str | None:
    if ctx.rng.random() < 0.25:
        return ctx.rng.choice(_SETTERS)
    from families import FAMILIES

    line = FAMILIES[ctx.rng.choice(_WRAPPED_FAMILIES)](ctx)
    if line is None:
        return None
    wrapper = ctx.rng.choice(_WRAPPERS)
    if line.startswith("with "):  # one `with` for both: a line holds one statement
        return f"with {wrapper}, {line[5:]}"
    return f"with {wrapper}: {line}"


def thread(ctx: Ctx) -> str | None:
    """Work in another thread: one started and joined on the line (the recording
    thread starts it), or the program's :func:`worker`, alive from its first use
    to the end of the program, so later segments record with it running."""
    t = ctx.new()
    g = ctx.gen()
    work = ctx.rng.choice([
        f"torch.rand(5{g})", f"torch.randn(17{g})", "torch.randint(0, 9, (4,))",
        "nn.Linear(3, 4).weight.detach()",
        "nn.init.trunc_normal_(torch.empty(6), std=0.5)",
        "torch.get_rng_state()[:64].clone()",
        "torch.empty(8).normal_()",
        "(torch.set_default_dtype(torch.float64), torch.zeros(2))[1]",
        "(torch.manual_seed(7), torch.rand(2))[1]",
    ])
    if ctx.rng.random() < 0.5:
        return f"{t} = __import__('ambient_families').worker().run(lambda: {work}).clone()"
    return (f"_out = []; _th = __import__('threading').Thread(target=lambda: _out.append({work})); "
            f"_th.start(); _th.join(); {t} = _out[0].clone()")


def refused(ctx: Ctx) -> str | None:
    """A call eager may refuse (a check only its kernels make), tried: both worlds
    must refuse it alike, at the same point, after the same draws and writes."""
    x = ctx.pick(lambda t: t.dim() >= 1 and t.numel() >= 2)
    if x is None:
        return None
    n = ctx.env[x].numel()
    one = f"{x}.reshape(-1)[:1].expand({n})"  # every element in one memory location
    flat = f"{x}.reshape(-1)"
    g = ctx.gen()
    line = ctx.rng.choice([
        f"{one}.add_(1)", f"{one}.uniform_({g[2:]})", f"{one}.normal_({g[2:]})",
        f"{one}.copy_({flat})", f"{one}.fill_(2)", f"{one}.bernoulli_(0.5{g})",
        f"nn.init.trunc_normal_({one})", f"nn.init.kaiming_uniform_({x})",
        f"{flat}[1:].add_({flat}[:-1])", f"{flat}[1:].copy_({flat}[:-1])",
        f"{x}.uniform_(2, 1{g})", f"{x}.random_(5, 2{g})", f"{x}.bernoulli_(1.5{g})",
        f"{x}.normal_(0, -1{g})", f"{x}.uniform_({g[2:]})", f"{x}.exponential_({g[2:]})",
        f"{x}.log_normal_({g[2:]})", f"nn.init.trunc_normal_({x})", f"nn.init.xavier_normal_({x})",
        f"torch.rand(3, dtype={x}.dtype{g})", f"torch.randn(3, dtype={x}.dtype{g})",
    ])
    return f"__import__('ambient_families').attempt(lambda: {line})"


def attempt(fn: Callable[[], Any]) -> None:
    """``fn()``, eager's refusal swallowed: whether it raised is seen in what follows.

    torchdefer's own refusals (a write into a real tensor, a view whose history
    fake tensors cannot rebuild) propagate: swallowed, the deferred world would
    go on without a call eager made, and the program would report the loud
    refusal as a silent difference (fuzz seed 20261205, a kaiming_uniform_ into
    a from_numpy tensor). Its copies of eager's refusals are swallowed as eager's.
    """
    try:
        with torch.no_grad():
            fn()
    except Exception as error:
        if isinstance(error, TorchdeferError) and not isinstance(error, EagerRefusalError):
            raise


class _Worker:
    """A thread that runs one function at a time for the program and waits for more."""

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, box, done = job
            try:
                box.append(fn())
            except BaseException as error:  # handed to the caller
                box.append(error)
            done.set()

    def run(self, fn: Callable[[], Any]) -> Any:
        box: list[Any] = []
        done = threading.Event()
        self._jobs.put((fn, box, done))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()


_worker: list[_Worker] = []


def worker() -> _Worker:
    """The program's worker thread, started at its first use."""
    if not _worker:
        _worker.append(_Worker())
    return _worker[0]


def stop_worker() -> None:
    """End the worker, if one runs: the harness calls it when a program ends."""
    while _worker:
        _worker.pop().stop()


def reset_ambient() -> None:
    """What the harness puts back after each segment, in both worlds."""
    torch.use_deterministic_algorithms(False)
    restore_default_device(None)  # torch 2.8's set_default_device(None) breaks get_default_device


@contextlib.contextmanager
def settings(dtype: torch.dtype | None = None, deterministic: bool = False,
             device: str | None = None) -> Iterator[None]:
    """A default dtype, deterministic mode or default device for the block, then none."""
    previous = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    torch.use_deterministic_algorithms(deterministic)
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
        reset_ambient()
