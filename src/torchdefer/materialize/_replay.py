"""Replay: run a slice of the recorded graph on real devices.

The tree of what a replay does, for whoever extends it::

    Replay.run(targets)
      make_plan(...)            which nodes, and which inputs the cache has
      _check_devices(...)       every device the slice needs exists here
      _run_node(node)           per node, in recording order
        CONSTANT / EXTERNAL       the captured or referenced tensor, moved
        DATA_SET                  the new value, detached
        RANDOM                    RngReplay.run: private generator state
          (a factory whose elements are all overwritten later only allocates)
        _pin_memory               fake._pinned.pin: page-locked, as eager's
        anything else             node.op(*args) with real tensors
      free values after their last use
"""

from __future__ import annotations

from typing import Any

import torch

from torchdefer._hooks import CALL_RUNNER
from torchdefer.errors import DeviceUnavailableError, ExternalTensorModifiedError, ReplayError
from torchdefer.fake import _pinned
from torchdefer.fake._output_device import device_available, missing_device
from torchdefer.materialize import concurrent
from torchdefer.materialize._cache import cache_for
from torchdefer.materialize._error_context import with_context
from torchdefer.materialize._parallel import split_draw
from torchdefer.materialize._plan import Substitute, make_plan
from torchdefer.materialize._rng_replay import RngReplay, call_checking_draws
from torchdefer.materialize._writes import call_watching_writes
from torchdefer.recorder._ambient import AmbientSwitch
from torchdefer.recorder._args import flatten_out, unflatten_call
from torchdefer.recorder._graph import Graph, Node, NodeKind, TensorMeta, Value
from torchdefer.recorder._mode import suspended
from torchdefer.recorder._rng_placement import meta_call
from torchdefer.rng._stream import Model

__all__ = ["Replay"]

_PIN_MEMORY = torch.ops.aten._pin_memory.default

# id(value) -> the real tensor computed for it in this replay.
_Env = dict[int, torch.Tensor]
# (id(value), version) -> the real tensor the cache answers.
_Cached = dict[tuple[int, int], torch.Tensor]


class Replay:
    """One materialization run over a graph, onto ``device`` (None: as recorded)."""

    def __init__(self, graph: Graph, device: torch.device | None) -> None:
        self.graph = graph
        self.device = device
        self.device_key = "recorded" if device is None else str(device)
        self.cache = cache_for(graph)
        self.rng = RngReplay(self, split_draw)

    def map_device(self, device: torch.device) -> torch.device:
        if self.device is None or device.type == "meta":
            return device
        return self.device

    def map_leaf(self, leaf: Any) -> Any:
        if isinstance(leaf, torch.device):
            return self.map_device(leaf)
        return leaf

    def nested(self, targets: list[tuple[Value, int]]) -> list[torch.Tensor]:
        """Inputs a node of this replay reads: the contents construction gave."""
        return Replay(self.graph, self.device).run(targets, inputs=True)

    def run(
        self,
        targets: list[tuple[Value, int]],
        names: list[str] | None = None,
        substitute: Substitute | None = None,
        *,
        inputs: bool = False,
    ) -> list[torch.Tensor]:
        """Real tensors for ``(value, version)`` targets, sharing storage where eager did.

        ``substitute`` may answer values itself (see :func:`make_plan`).
        ``inputs``: the targets are inputs of a replay, not tensors for the user
        (see ``ReplayCache.lookup``).
        """
        # Materializing (or a data read) inside deferred_init: what replay runs,
        # the cache's views over real storages included, is real, not recorded.
        with suspended(), self.cache.call():
            return self._run(targets, names, substitute, inputs)

    def _run(
        self,
        targets: list[tuple[Value, int]],
        names: list[str] | None,
        substitute: Substitute | None,
        inputs: bool,
    ) -> list[torch.Tensor]:
        plan = make_plan(targets, self.cache, self.device_key, self.device, substitute,
                         aliases=not inputs)
        self._check_devices(plan.nodes, targets, names)
        last_use = _last_uses(plan.nodes, targets)
        env: dict[int, torch.Tensor] = {}
        # id(storage) -> {id(value): (value, real layout)} of the values computed
        layouts: dict[int, dict[int, tuple[Value, TensorMeta]]] = {}
        beside_others = concurrent.on_worker()  # may not switch process-wide settings
        with torch.no_grad(), AmbientSwitch() as ambient:
            try:
                for i, node in enumerate(plan.nodes):
                    if beside_others:
                        concurrent.check_ambient(node.ambient)
                    ambient.use(node.ambient)  # default dtype, deterministic mode
                    if id(node) in plan.passthrough:
                        outs = self._pass_through(node, env, plan.cached)
                    elif id(node) in plan.allocate:  # every element is set later
                        outs = [self._empty(node.outputs[0])]
                    else:
                        standin = (id(node), 0) in plan.standins
                        outs = self._run_checked(node, env, plan.cached, standin)
                    for value in node.outputs:
                        real = env[id(value)] = outs[value.index]
                        self.cache.check_layout(value, real, self.device_key)
                        if isinstance(real, torch.Tensor):
                            layouts.setdefault(id(value.storage), {})[id(value)] = (
                                value, TensorMeta.of(real, real.device)
                            )
                    for value in node.inputs:
                        if last_use.get(id(value)) == i:
                            env.pop(id(value), None)
            finally:
                self.rng.release()
        results = []
        for value, version in targets:
            real = plan.cached.get((id(value), version))
            if real is None:
                real = env[id(value)]
                if version == value.storage.version:
                    seen = layouts.get(id(value.storage))
                    self.cache.store(value, version, self.device_key, real, seen)
            results.append(real)
        return results

    def _pass_through(self, node: Node, env: _Env, cached: _Cached) -> list[Any]:
        """An in-place write a later write hides: its output is its first argument."""
        first = node.inputs[0]
        real = cached.get((id(first), node.reads[0]))
        return [real if real is not None else env[id(first)]] * len(node.outputs)

    def _run_checked(
        self, node: Node, env: _Env, cached: _Cached, standin: bool = False
    ) -> list[Any]:
        """Run ``node``; a failure is re-raised naming the node, keeping its type.

        The new exception is both a :class:`ReplayError` and an instance of the
        original class (``torch.OutOfMemoryError`` stays catchable as such).
        """
        try:
            return self._run_node(node, env, cached, standin)
        except ReplayError:
            raise
        except Exception as e:
            message = (
                f"While replaying {node.name} ({node.kind}) recorded at {node.where()}: "
                f"{type(e).__name__}: {e}"
            )
            raise with_context(e, message).with_traceback(e.__traceback__) from e

    def _run_node(
        self, node: Node, env: _Env, cached: _Cached, standin: bool = False
    ) -> list[Any]:
        """``standin``: the first input lends only its dtype and device (``Plan.standins``)."""
        kind = node.kind
        if kind == NodeKind.CONSTANT:
            device = self.map_device(node.outputs[0].meta.device)
            return _pinned_as_recorded(node, [node.payload.to(device, copy=True)])
        if kind == NodeKind.EXTERNAL:
            return [self.external(node)]
        reads = iter(node.reads)
        leaves = []
        for leaf in node.leaves:
            if isinstance(leaf, Value):
                version = next(reads)
                if standin and leaf is node.inputs[0]:
                    leaves.append(self._standin(leaf.meta))
                    standin = False
                    continue
                real = cached.get((id(leaf), version))
                leaf = real if real is not None else env[id(leaf)]
            else:
                leaf = self.map_leaf(leaf)
            leaves.append(leaf)
        if kind == NodeKind.DATA_SET:
            return [leaves[0].detach()]
        if node.op is _PIN_MEMORY:
            return [_pinned.pin(leaves[0])]
        args, kwargs = unflatten_call(leaves, node.spec)
        pinning = bool(kwargs.get("pin_memory"))
        if pinning:  # pinned once, after, where the storage says (and on the CPU only)
            kwargs = {**kwargs, "pin_memory": False}
        if kind == NodeKind.RANDOM:
            out = call_watching_writes(node, leaves, lambda: self.rng.run(node, args, kwargs))
        else:
            out = call_watching_writes(
                node, leaves, lambda: call_checking_draws(node, args, kwargs)
            )
        return _pinned_as_recorded(node, flatten_out(out)) if pinning else flatten_out(out)

    def _empty(self, value: Value) -> torch.Tensor:
        """Uninitialized memory laid out as a factory's recorded output (page-locked
        if eager's was)."""
        meta = value.meta
        out = torch.empty_strided(meta.size, meta.stride, dtype=meta.dtype,
                                  device=self.map_device(meta.device))
        return _pinned.pin(out) if value.storage.pinned else out

    def _standin(self, meta: TensorMeta) -> torch.Tensor:
        """An empty tensor of ``meta``'s dtype and device: all a ``new_*`` op reads."""
        return torch.empty(0, dtype=meta.dtype, device=self.map_device(meta.device))

    def external(self, node: Node) -> torch.Tensor:
        """The real tensor an EXTERNAL node refers to, on the replay's device; refused if
        it changed since it was recorded."""
        ref = node.payload
        real: torch.Tensor = ref.tensor
        change = ref.changed()
        if change is not None:
            raise ExternalTensorModifiedError(
                f"The real tensor of shape {tuple(real.shape)} and dtype {real.dtype} used "
                f"at {node.where()} was {change} after it was recorded, so replaying would "
                "give a value eager code never saw. Materialize before modifying it, or "
                "pass a clone (`t.clone()`) to the constructor."
            )
        return real.to(self.map_device(real.device))

    def _check_devices(
        self, nodes: list[Node], targets: list[tuple[Value, int]], names: list[str] | None
    ) -> None:
        for node in nodes:
            for value in node.outputs:
                device = self.map_device(value.meta.device)
                if device_available(device):
                    continue
                asked = self.device is not None and device != value.meta.device
                where = missing_device(value.meta.device, device, asked, "materialized on")
                raise DeviceUnavailableError(
                    f"{_describe(targets, names)} {where}, which this process does not "
                    f"have (first needed by {node.name} at {node.where()}). Pass a device "
                    "this process has, e.g. materialize_module(model, device='cpu')."
                )


def _last_uses(nodes: list[Node], targets: list[tuple[Value, int]]) -> dict[int, int]:
    last: dict[int, int] = {}
    for i, node in enumerate(nodes):
        for value in node.inputs:
            last[id(value)] = i
    for value, _ in targets:
        last[id(value)] = len(nodes)  # targets are never freed
    return last


def _describe(targets: list[tuple[Value, int]], names: list[str] | None) -> str:
    if names:
        shown = ", ".join(f"'{n}'" for n in names[:3])
        return f"Tensor {shown}" + (f" (and {len(names) - 3} more)" if len(names) > 3 else "")
    meta = targets[0][0].meta
    return f"The tensor of shape {meta.size} and dtype {meta.dtype}"


def _pinned_as_recorded(node: Node, outs: list[Any]) -> list[Any]:
    """``outs`` with each output pinned whose recorded storage is (``pin_memory=True``,
    ``torch.tensor(data, pin_memory=True)``): one pinning, as eager's."""
    return [_pinned.pin(out) if isinstance(out, torch.Tensor) and value.storage.pinned else out
            for out, value in zip(outs, node.outputs)]


def _run_call(node: Node, state: torch.Tensor, model: Model) -> torch.Tensor:
    """The generator state after random ``node`` run from ``state`` (``_hooks.CALL_RUNNER``:
    the anchor after a call the draw model cannot count)."""
    steps = getattr(node.op, "steps", None)
    if steps is not None and model == "cpu":
        # A composite that knows its draws in bounded memory (a rejection loop).
        args, kwargs, _ = meta_call(node)
        with suspended(), torch.no_grad():
            after: torch.Tensor | None = steps(state, *args, **kwargs)
        if after is not None:
            return after
    device = torch.device("cpu") if model == "cpu" else model  # a model is its device
    replay = Replay(node.graph, device)  # type: ignore[arg-type]
    try:
        with suspended(), torch.no_grad():
            return replay.rng.run_into_scratch(node, state)
    finally:
        replay.rng.release()


CALL_RUNNER.install(_run_call)
