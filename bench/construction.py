"""Suite 1: building a model with deferred_init, the meta device, FakeTensorMode, eagerly.

Each case builds one model one way in a fresh child. Before the measured
window, the child builds a tiny model of the same family the same way, so
one-time costs (lazy imports inside ``transformers``, dispatch caches) are not
charged to the case: they are the same for every size and would hide how cost
grows with it. Small cases are repeated (median time reported); the peak is
the highest over repeats.

Per case the child reports: wall time, peak RSS above the baseline, the RSS
the built model keeps (``retained``), the parameter count, and for
``deferred_init`` the number of recorded ops and the bytes the graph holds
(walked object by object, see :func:`graph_nbytes`). Also the time of the
cyclic garbage collector's full passes inside each build (``full_gc``): one
pass scans every object of the process (~0.15-0.2 s with torch and
transformers loaded) and starts once enough new objects have lived long
(a quarter of the process's old ones), so a deep enough model pays one. A
recording keeps ~9 objects per op alive: in the committed run only
``deferred_init`` of the deepest shape (10,908 ops) paid one. It is a step,
not a cost per op: the report fits time against ops with and without it.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from bench.memory import rss
from bench.models import ModelSpec, build_fn, spec_named

__all__ = ["METHODS", "graph_nbytes", "run_case"]

# Method name -> how to build (constructor, args) with it.
METHODS: dict[str, Callable[[Callable[..., Any], tuple], Any]] = {}


def _method(name: str):
    def register(fn):
        METHODS[name] = fn
        return fn

    return register


@_method("deferred_init")
def _deferred(fn, args):
    import torchdefer

    return torchdefer.deferred_init(fn, *args)


@_method("meta")
def _meta(fn, args):
    with torch.device("meta"):
        return fn(*args)


@_method("meta+init")
def _meta_init(fn, args):
    """The meta device, then the init pass ``transformers`` skips on meta.

    Under ``torch.device("meta")`` transformers does not run ``init_weights``
    (there is nothing to initialize), so plain ``meta`` does less work than
    the other methods; this variant runs the same init ops, on meta tensors.
    """
    with torch.device("meta"):
        model = fn(*args)
    if hasattr(model, "init_weights"):
        model.init_weights()
    return model


@_method("FakeTensorMode")
def _fake(fn, args):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return fn(*args)


@_method("eager")
def _eager(fn, args):
    return fn(*args)


def run_case(case: dict[str, Any], probe) -> dict[str, Any]:
    """Child side: build ``case["model"]`` with ``case["method"]``, ``repeats`` times at most."""
    spec = spec_named(case["model"])
    build = METHODS[case["method"]]
    fn, args = build_fn(spec)
    _warm_up(spec, build)
    repeats = case.get("repeats", 1)
    result: dict[str, Any] = {}
    times, full_gc = [], []
    full = _FullCollections()
    probe.begin()
    for r in range(repeats):
        torch.manual_seed(0)
        with probe.measure(f"build {r}") as phase, full.counting():  # after the probe's collect
            model = build(fn, args)
        times.append(phase["seconds"])
        full_gc.append(full.seconds)
        if r == 0:
            gc.collect()
            result.update(_describe(model, case["method"]))
            result["retained"] = rss() - probe.baseline
        if r + 1 < repeats and sum(times) < case.get("repeat_below", 2.0):
            del model
            gc.collect()
            continue
        break
    probe.stop()
    if case.get("fingerprint"):
        from bench.fingerprint import fingerprint

        result["fingerprint"] = fingerprint(model)
    result["seconds"] = statistics.median(times)
    result["times"] = times
    result["full_gc"] = full_gc
    # The full passes inside the median build (the middle one by time).
    result["full_gc_seconds"] = full_gc[sorted(range(len(times)), key=times.__getitem__)[
        (len(times) - 1) // 2]]
    return result


class _FullCollections:
    """The time of the collector's full (oldest-generation) passes inside :meth:`counting`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self.seconds = 0.0
        gc.callbacks.append(self._callback)
        try:
            yield
        finally:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start


def _warm_up(spec: ModelSpec, build) -> None:
    tiny = "stack-tiny" if spec.family == "stack" else "llama-tiny"
    fn, args = build_fn(spec_named(tiny))
    build(fn, args)
    gc.collect()


def _describe(model: torch.nn.Module, method: str) -> dict[str, Any]:
    params = {id(p): p.numel() for p in model.parameters()}
    out: dict[str, Any] = {"params": sum(params.values())}
    if method == "deferred_init":
        graph = next(iter(model.parameters()))._graph
        out["ops"] = graph.op_count
        out["graph_bytes"] = graph_nbytes(model)
    return out


def graph_nbytes(module: torch.nn.Module) -> int:
    """Bytes held by the recorded graph behind ``module``'s deferred tensors.

    Walks every object the graph reaches (nodes, values, storages, metadata,
    flattened arguments, RNG snapshots, captured constants) once, summing
    ``sys.getsizeof`` and tensor storage sizes. Shared interpreter objects (op
    overloads, dtypes, devices, the module tree) are not counted: the meta
    device holds those too.
    """
    from torchdefer.recorder import DeferredTensor, Graph

    roots: list[Any] = []
    graph = None
    for t in [*module.parameters(), *module.buffers()]:
        if isinstance(t, DeferredTensor):
            roots.append(t._value)
            graph = t._graph
    if graph is not None:
        roots += [graph.rng.streams, graph.observations, graph.externals, graph.rng.cpu_start]
    stop = (Graph, torch.nn.Module, torch.dtype, torch.device, torch.Generator, type,
            torch._ops.OpOverload, torch._ops.OpOverloadPacket, types.FunctionType,
            types.BuiltinFunctionType, types.ModuleType)
    seen: set[int] = set()
    total = 0
    stack = roots
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, stop):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, torch.Tensor):
            if not isinstance(obj, DeferredTensor) and obj.device.type != "meta":
                total += obj.untyped_storage().nbytes()
            continue
        stack.extend(_children(obj))
    return total


def _children(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [*obj.keys(), *obj.values()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return []
    children = []
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if hasattr(obj, slot):
                children.append(getattr(obj, slot))
    if hasattr(obj, "__dict__"):
        children.append(obj.__dict__)
    return children
