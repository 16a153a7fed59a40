"""The calls of a row replay: a storage's creator and a random op, on part of their elements.

Helpers of :mod:`torchdefer.distributed._rows`, which decides what to compute;
here a recorded call is rebuilt to produce only elements ``[s, e)`` (a random
call through :class:`torchdefer.materialize._local_call.LocalCall`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from torchdefer.materialize import _parallel as parallel
from torchdefer.materialize._local_call import BLOCKS, PER_ELEMENT, LocalCall, NotSliceable
from torchdefer.recorder._args import unflatten_call
from torchdefer.recorder._graph import Node, NodeKind, TensorMeta, Value
from torchdefer.recorder._rng_placement import NODE_READER, meta_call
from torchdefer.rng import _chunks as chunks
from torchdefer.rng import _ranges as ranges
from torchdefer.rng import draws
from torchdefer.rng._stream import Position, call_effect

if TYPE_CHECKING:
    from torchdefer.distributed._rows import RowReplay, Span, Step

__all__ = ["NotSliceable", "composite_step", "contiguous_range", "creator_step", "random_step"]

_aten = torch.ops.aten


# Factories whose elements are all one constant (None: uninitialized memory).
_CONSTANT_FACTORIES: dict[Any, Any] = {
    **dict.fromkeys(
        (_aten.empty, _aten.empty_strided, _aten.new_empty, _aten.new_empty_strided,
         _aten.empty_like, _aten.empty_permuted), None),
    **dict.fromkeys((_aten.zeros, _aten.new_zeros, _aten.zeros_like), 0),
    **dict.fromkeys((_aten.ones, _aten.new_ones, _aten.ones_like), 1),
    **dict.fromkeys((_aten.full, _aten.new_full, _aten.full_like), "fill_value"),
}  # fmt: skip
# Out-of-place elementwise ops besides the pointwise-tagged ones.
_ELEMENTWISE = frozenset({_aten._to_copy.default, _aten.clone.default})


def creator_step(rows: RowReplay, node: Node, created: Value, span: Span) -> Step:
    """The first step of a span: its elements as the storage's creator made them."""
    packet = getattr(node.op, "overloadpacket", None)
    if packet in _CONSTANT_FACTORIES:
        fill = _CONSTANT_FACTORIES[packet]
        if fill == "fill_value":
            fill = _schema_value(node, "fill_value")
            if isinstance(fill, Value):
                raise NotSliceable(node, "its fill value is a tensor")
        if fill is not None:
            return lambda buf: buf.fill_(fill)  # type: ignore[return-value]
        return lambda buf: _uninitialized(rows, node, buf)
    if not _in_order(created, span):
        raise NotSliceable(node, "its output is not laid out in order")
    if node.kind == NodeKind.RANDOM:
        return random_step(rows, node, 0, _numel(created), span.lo, span.hi, 0)
    if node.kind == NodeKind.CONSTANT:
        payload = node.payload

        def constant(buf: torch.Tensor) -> None:
            buf.copy_(payload.reshape(-1)[span.lo : span.hi])

        return constant
    if node.kind == NodeKind.EXTERNAL:  # a real tensor (what dcp.load read), change-checked

        def external(buf: torch.Tensor) -> None:
            buf.copy_(rows.replay.external(node).reshape(-1)[span.lo : span.hi])

        return external
    if node.kind == NodeKind.CALL and len(node.outputs) == 1 and _elementwise(node):
        return _elementwise_creator(rows, node, created, span)
    if node.op is _aten._pin_memory.default:  # a copy; RowReplay pins what it computed
        return _elementwise_creator(rows, node, created, span, copy=True)
    raise NotSliceable(node, "creates a tensor from more than its own elements")


def _elementwise_creator(rows: RowReplay, node: Node, created: Value, span: Span,
                         copy: bool = False) -> Step:
    """An out-of-place elementwise op applied to the spans of its inputs (``copy``: the
    op copies its first argument)."""
    inputs = rows.elementwise_inputs(
        node, skip=None, shape=created.meta.size, ordered=True, shift=(span.lo, span.hi)
    )
    if not any(not isinstance(x, tuple) for x in inputs.values()):
        raise NotSliceable(node, "no input has the output's shape")

    def step(buf: torch.Tensor) -> None:
        leaves = rows.real_leaves(node, inputs, None)
        args, kwargs = unflatten_call(leaves, node.spec)
        rows.use(node)
        buf.copy_(args[0] if copy else node.op(*args, **kwargs))

    return step


def random_step(rows: RowReplay, node: Node, o: int, n: int, s: int, e: int, at: int) -> Step:
    """Elements ``[s, e)`` of random ``node`` drawing ``n`` elements, into ``buf[at:]``.

    The node writes (or creates) elements ``[o, o + n)`` of its storage in order.
    """
    packet = getattr(node.op, "overloadpacket", None)
    if (packet not in PER_ELEMENT and packet not in BLOCKS) or node.rng is None:
        raise NotSliceable(node, "a random op whose elements do not take words of their own")
    stream = node.rng.stream
    device = rows.replay.map_device(stream.device)
    if device.type != "cpu":
        # Philox streams: per-thread offsets, not per element
        raise NotSliceable(node, f"draws from the {device.type} generator")
    effect = call_effect(node, "cpu", NODE_READER)
    if not isinstance(effect, draws.Effect) or effect.normals:
        raise NotSliceable(node, "its draws are not modeled per element (or use cached normals)")
    call = LocalCall(node, device)
    model = ranges.element_model(
        call.key, packet in BLOCKS, call.effect_of, call.run, call.dtype, device
    )
    if model is None or (model.blocks and n < ranges.BLOCK):
        raise NotSliceable(node, "this class of call did not slice on this torch")
    state_at = _state_at(node)
    lock = threading.Lock()  # run() is called from the threads of parallel.chunks

    def run(out: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        with lock:
            rows.drawn += out.numel()
            rows.use(node)
        return call.run(out, state)

    def step(buf: torch.Tensor) -> None:
        chunks.draw_range(model, n, effect.words, s, e, buf[at : at + e - s], state_at, run,
                          parallel.current_threads(), parallel.chunk_floor(), parallel.chunk_lead())

    return step


def composite_rows(node: Node) -> Any:
    """What a composite node says about drawing its elements on their own, or None."""
    hook = getattr(node.op, "rows", None)
    if hook is None or node.rng is None:
        return None
    args, kwargs, _ = meta_call(node)
    return hook(*args, **kwargs)


def composite_step(rows: RowReplay, node: Node, n: int, s: int, e: int, at: int) -> Step:
    """Elements ``[s, e)`` of a composite that writes ``n`` elements in order (a
    rejection loop whose elements keep their own draws: ``rng._rejection``)."""
    loop = composite_rows(node)
    if loop is None or loop.n != n:
        raise NotSliceable(node, "its elements depend on each other's draws")
    stream = node.rng.stream  # type: ignore[union-attr]
    if rows.replay.map_device(stream.device).type != "cpu":
        raise NotSliceable(node, "draws from a CUDA generator")
    state_at = _state_at(node)

    def step(buf: torch.Tensor) -> None:
        rows.use(node)
        drawn = loop.rows(s, e, buf[at : at + e - s], state_at)
        if drawn is None:  # rng.uniform_rejection: a decision the kernels' path could change
            raise NotSliceable(node, "an acceptance test rounds differently along two paths")
        rows.drawn += drawn

    return step


def _state_at(node: Node) -> Callable[[int], torch.Tensor]:
    """``state_at(words)``: the CPU state ``words`` past ``node``'s first word."""
    place = node.rng  # a random node's: never None here
    stream = place.stream  # type: ignore[union-attr]
    states = node.graph.rng.states  # type: ignore[union-attr]
    epoch = stream.epochs[place.epoch]  # type: ignore[union-attr]
    start = states.layout(stream, epoch, "cpu").starts[place.index]  # type: ignore[union-attr]

    def state_at(words: int) -> torch.Tensor:
        return states.state_at(
            stream, epoch, "cpu", Position(start.anchor, start.words + words, start.cache)
        )

    return state_at


def _uninitialized(rows: RowReplay, node: Node, buf: torch.Tensor) -> None:
    """What ``torch.empty`` gave: nothing to do, unless deterministic mode filled it."""
    ambient = node.ambient
    if ambient is not None and ambient.deterministic and ambient.fill_uninitialized_memory:
        rows.use(node)
        buf.copy_(torch.empty(buf.shape, dtype=buf.dtype, device=buf.device))


def _schema_value(node: Node, name: str) -> Any:
    try:
        return draws.schema_value(node.op, *node.arguments(), name)
    except KeyError:
        raise NotSliceable(node, f"has no argument {name}") from None


def _elementwise(node: Node) -> bool:
    return node.op in _ELEMENTWISE or torch.Tag.pointwise in getattr(node.op, "tags", ())


def _numel(value: Value) -> int:
    return math.prod(value.meta.size)


def _in_order(value: Value, span: Span) -> bool:
    """Whether ``value`` lays out its storage's elements in order from the first."""
    rng = contiguous_range(value.meta)
    return rng is not None and rng[0] == 0 and rng[1] >= span.hi


def contiguous_range(meta: TensorMeta) -> tuple[int, int] | None:
    """``[start, stop)`` if ``meta`` views consecutive elements of its storage in order
    (and plainly: no lazy conjugate or negative bit)."""
    if meta.conj or meta.neg:
        return None
    numel = math.prod(meta.size)
    expected = 1
    for size, stride in zip(reversed(meta.size), reversed(meta.stride)):
        if size != 1 and stride != expected:
            return None
        expected *= size
    return meta.offset, meta.offset + numel
