"""Suite 3: the cost of one call of a common init op, recorded vs meta vs FakeTensorMode.

Each op runs ``n`` times in a loop on a 1024x1024 fp32 tensor (the size does
not matter to any of the three: none computes), inside ``deferred_init``,
under ``torch.device("meta")`` and under ``FakeTensorMode``. The best of
``repeats`` loops is reported, in microseconds per call. Composite calls
(``nn.init.*``, ``nn.Linear``) record several ops; the recorded-op count per
call is reported so the cost per recorded op can be read too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["CONTEXTS", "OPS", "run_case"]

N = 1024


def _kaiming(x, y):
    return nn.init.kaiming_uniform_(x, a=math.sqrt(5))


# name -> fn(x, y), x and y being N x N tensors made in the same context.
OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "torch.empty": lambda x, y: torch.empty(N, N),
    "torch.zeros": lambda x, y: torch.zeros(N, N),
    "torch.ones": lambda x, y: torch.ones(N, N),
    "torch.randn": lambda x, y: torch.randn(N, N),
    "torch.arange": lambda x, y: torch.arange(N),
    "Tensor.normal_": lambda x, y: x.normal_(0.0, 0.02),
    "Tensor.uniform_": lambda x, y: x.uniform_(-0.1, 0.1),
    "Tensor.zero_": lambda x, y: x.zero_(),
    "Tensor.fill_": lambda x, y: x.fill_(1.0),
    "Tensor.mul_": lambda x, y: x.mul_(0.5),
    "Tensor.copy_": lambda x, y: x.copy_(y),
    "x + y": lambda x, y: x + y,
    "Tensor.t (a view)": lambda x, y: x.t(),
    "Tensor.view": lambda x, y: x.view(-1),
    "nn.init.kaiming_uniform_": _kaiming,
    "nn.init.xavier_uniform_": lambda x, y: nn.init.xavier_uniform_(x),
    # trunc_normal_ reads data (``mask.any()``): meta and FakeTensorMode cannot
    # run it, deferred_init materializes that value. On a fresh tensor each
    # call, as in a real init, so the value read is one op deep.
    "empty + nn.init.trunc_normal_": lambda x, y: nn.init.trunc_normal_(
        torch.empty(N, N), std=0.02),
    "nn.Linear(1024, 1024)": lambda x, y: nn.Linear(N, N),
    "nn.Embedding(32000, 1024)": lambda x, y: nn.Embedding(32000, N),
}


# Ops that compute for real (a data read) run fewer times.
_FEWER = {"empty + nn.init.trunc_normal_": 20}


def _loop(op, n: int) -> tuple[float, int]:
    """Run ``op`` n times on fresh tensors of the current context: (seconds, graph ops)."""
    x, y = torch.empty(N, N), torch.empty(N, N)
    graph = getattr(x, "_graph", None)
    before = graph.op_count if graph is not None else 0
    start = time.perf_counter()
    for _ in range(n):
        op(x, y)
    seconds = time.perf_counter() - start
    return seconds, (graph.op_count - before if graph is not None else 0)


def _deferred(op, n):
    import torchdefer

    return torchdefer.deferred_init(_loop, op, n)


def _meta(op, n):
    with torch.device("meta"):
        return _loop(op, n)


def _fake(op, n):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return _loop(op, n)


CONTEXTS: dict[str, Callable[[Any, int], tuple[float, int]]] = {
    "deferred_init": _deferred,
    "meta": _meta,
    "FakeTensorMode": _fake,
}


def run_case(case: dict[str, Any], probe) -> dict[str, Any]:
    """Child side: every op in every context; µs per call (best of ``repeats``)."""
    n, repeats = case["n"], case["repeats"]
    probe.begin()
    rows = []
    for name, op in OPS.items():
        row: dict[str, Any] = {"op": name}
        calls = max(n // _FEWER.get(name, 1), 2)
        for context_name, context in CONTEXTS.items():
            row[context_name] = _time(context, op, calls, repeats, row)
        rows.append(row)
        probe.progress(f"{name}: " + ", ".join(
            f"{c} {_us(row[c])}" for c in CONTEXTS))
    probe.stop()
    return {"rows": rows, "n": n, "repeats": repeats, "fewer": _FEWER}


def _time(context, op, calls: int, repeats: int, row: dict[str, Any]) -> float | None:
    """Best µs per call over ``repeats`` loops, after a warm-up; None if it cannot run."""
    try:
        context(op, 2)  # dispatch caches, lazy imports
        best = math.inf
        for _ in range(repeats):
            seconds, ops = context(op, calls)
            best = min(best, seconds)
            if ops:
                row["ops_per_call"] = ops / calls
        return best / calls * 1e6
    except Exception as e:
        row.setdefault("errors", {})[context.__name__.strip("_")] = (
            f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
        return None


def _us(value: float | None) -> str:
    return "cannot run" if value is None else f"{value:.1f} µs"
