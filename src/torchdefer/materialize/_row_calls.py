"""The calls of a row replay: a storage's creator and a random op, on part of their elements.

Helpers of :mod:`torchdefer.materialize.rows`, which decides what to compute;
here a recorded call is rebuilt to produce only elements ``[s, e)``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from torchdefer.materialize import parallel
from torchdefer.materialize._overwrites import writes_first_argument
from torchdefer.materialize.rng import draw
from torchdefer.recorder._args import unflatten_call
from torchdefer.recorder.graph import Node, NodeKind, TensorMeta, Value
from torchdefer.recorder.rng import NODE_READER, meta_call
from torchdefer.rng import chunks, draws, ranges
from torchdefer.rng.stream import Position, call_effect

if TYPE_CHECKING:
    from torchdefer.materialize.rows import RowReplay, Span, Step

__all__ = ["NotSliceable", "composite_step", "contiguous_range", "creator_step", "random_step"]

_aten = torch.ops.aten


class NotSliceable(Exception):  # a signal inside row replay, never raised to users
    """Some op in a span's history cannot be computed on part of its elements."""

    def __init__(self, node: Node | None, why: str) -> None:
        where = "" if node is None else f"{node.name} at {node.where()}: "
        super().__init__(f"{where}{why}")


# Factories whose elements are all one constant (None: uninitialized memory).
_CONSTANT_FACTORIES: dict[Any, Any] = {
    **dict.fromkeys(
        (_aten.empty, _aten.empty_strided, _aten.new_empty, _aten.new_empty_strided,
         _aten.empty_like, _aten.empty_permuted), None),
    **dict.fromkeys((_aten.zeros, _aten.new_zeros, _aten.zeros_like), 0),
    **dict.fromkeys((_aten.ones, _aten.new_ones, _aten.ones_like), 1),
    **dict.fromkeys((_aten.full, _aten.new_full, _aten.full_like), "fill_value"),
}  # fmt: skip
# Random ops whose CPU kernels draw element after element (or in Box-Muller
# blocks), the only ones sliced; `rng.ranges` checks each class on this torch.
_PER_ELEMENT = frozenset(
    {_aten.uniform_, _aten.rand, _aten.rand_like, _aten.random_, _aten.randint,
     _aten.randint_like, _aten.exponential_, _aten.geometric_, _aten.cauchy_, _aten.bernoulli_}
)  # fmt: skip
_BLOCKS = draws.NORMAL_BLOCKS
_LIKE = frozenset({_aten.rand_like, _aten.randn_like, _aten.randint_like})
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
    if (packet not in _PER_ELEMENT and packet not in _BLOCKS) or node.rng is None:
        raise NotSliceable(node, "a random op whose elements do not take words of their own")
    stream = node.rng.stream
    device = rows.replay.map_device(stream.device)
    if device.type != "cpu":
        # Philox streams: per-thread offsets, not per element
        raise NotSliceable(node, f"draws from the {device.type} generator")
    effect = call_effect(node, "cpu", NODE_READER)
    if not isinstance(effect, draws.Effect) or effect.normals:
        raise NotSliceable(node, "its draws are not modeled per element (or use cached normals)")
    call = _LocalCall(node, device)
    model = ranges.element_model(
        call.key, packet in _BLOCKS, call.effect_of, call.run, call.dtype, device
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
    rejection loop whose elements keep their own draws: ``rng.rejection``)."""
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


class _LocalCall:
    """A random node's call rebuilt to draw into a given 1-D tensor of any length."""

    def __init__(self, node: Node, device: torch.device) -> None:
        self.node = node
        self.device = device
        self.stream = node.rng.stream  # type: ignore[union-attr]
        self.packet = node.op.overloadpacket
        self.factory = not writes_first_argument(node.op) and self.packet not in _LIKE
        tensors = [i for i, leaf in enumerate(node.leaves) if isinstance(leaf, Value)]
        # The tensor drawn into is self (in place) or the template (*_like);
        # factories take none. Any other tensor (a probability per element) stops.
        if tensors != ([] if self.factory else [0]):
            raise NotSliceable(node, "takes a tensor argument besides the one it draws into")
        self.dtype = node.outputs[0].meta.dtype
        args, kwargs = self._call(torch.empty(0, dtype=self.dtype, device="meta"))
        self.key = (node.op, self.dtype, _frozen(args), _frozen(kwargs))

    def _call(self, out: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
        node = self.node
        leaves = [out if isinstance(leaf, Value) else leaf for leaf in node.leaves]
        args, kwargs = unflatten_call(leaves, node.spec)
        if self.factory:
            args, kwargs = _with_size(node.op, args, kwargs, [out.numel()])
        kwargs = {k: self._device(v) for k, v in kwargs.items()}
        return tuple(self._device(a) for a in args), kwargs

    def _device(self, leaf: Any) -> Any:
        return self.device if isinstance(leaf, torch.device) else leaf

    def run(self, out: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        args, kwargs = self._call(out)
        result, after = draw(self.node, self.stream, self.device, state, args, kwargs)
        if result is not out:
            out.copy_(result)
        return after

    def effect_of(self, n: int) -> draws.Effect | None:
        drawn = torch.empty(n, dtype=self.dtype, device="meta")
        args, kwargs = self._call(drawn)
        return draws.effect(self.node.op, args, kwargs, drawn)


def _uninitialized(rows: RowReplay, node: Node, buf: torch.Tensor) -> None:
    """What ``torch.empty`` gave: nothing to do, unless deterministic mode filled it."""
    ambient = node.ambient
    if ambient is not None and ambient.deterministic and ambient.fill_uninitialized_memory:
        rows.use(node)
        buf.copy_(torch.empty(buf.shape, dtype=buf.dtype, device=buf.device))


def _with_size(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], size: list[int]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    for i, argument in enumerate(func._schema.arguments):
        if argument.name == "size":
            if i < len(args):
                return (*args[:i], size, *args[i + 1 :]), kwargs
            return args, {**kwargs, "size": size}
    raise NotSliceable(None, f"{func} has no size argument")


def _schema_value(node: Node, name: str) -> Any:
    try:
        return draws.schema_value(node.op, *node.arguments(), name)
    except KeyError:
        raise NotSliceable(node, f"has no argument {name}") from None


def _frozen(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return tuple(_frozen(y) for y in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in x.items()))
    if isinstance(x, torch.Tensor):
        return ("tensor", x.dtype)
    if isinstance(x, torch.Generator):
        return "generator"
    return x


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
