"""A random node's call rebuilt to draw part of its elements: the piece both chunked
draws and row replay need.

:mod:`torchdefer.materialize._parallel` draws one large CPU fill in chunks, each
from its own jumped state; the row replay of sharded ranks
(:mod:`torchdefer.distributed._rows`) draws only a shard's elements. Both rebuild
a recorded random call to draw into a 1-D tensor of any length
(:class:`LocalCall`), for the classes of call whose elements take words of
their own (:data:`PER_ELEMENT`, :data:`BLOCKS`), and stop on
:class:`NotSliceable` where a call cannot be cut. It lives here, below both,
so that materialize never imports distributed.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdefer.materialize._overwrites import writes_first_argument
from torchdefer.materialize._rng_replay import draw
from torchdefer.recorder._args import unflatten_call
from torchdefer.recorder._graph import Node, Value
from torchdefer.rng import draws

__all__ = ["BLOCKS", "LIKE", "PER_ELEMENT", "LocalCall", "NotSliceable", "with_size"]

_aten = torch.ops.aten


class NotSliceable(Exception):  # a signal inside row replay, never raised to users
    """Some op in a span's history cannot be computed on part of its elements."""

    def __init__(self, node: Node | None, why: str) -> None:
        where = "" if node is None else f"{node.name} at {node.where()}: "
        super().__init__(f"{where}{why}")


# Random ops whose CPU kernels draw element after element (or in Box-Muller
# blocks), the only ones sliced; `rng._ranges` checks each class on this torch.
PER_ELEMENT = frozenset(
    {_aten.uniform_, _aten.rand, _aten.rand_like, _aten.random_, _aten.randint,
     _aten.randint_like, _aten.exponential_, _aten.geometric_, _aten.cauchy_, _aten.bernoulli_}
)  # fmt: skip
BLOCKS = draws.NORMAL_BLOCKS
LIKE = frozenset({_aten.rand_like, _aten.randn_like, _aten.randint_like})


class LocalCall:
    """A random node's call rebuilt to draw into a given 1-D tensor of any length."""

    def __init__(self, node: Node, device: torch.device) -> None:
        self.node = node
        self.device = device
        self.stream = node.rng.stream  # type: ignore[union-attr]
        self.packet = node.op.overloadpacket
        self.factory = not writes_first_argument(node.op) and self.packet not in LIKE
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
            args, kwargs = with_size(node.op, args, kwargs, [out.numel()])
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


def with_size(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], size: list[int]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    for i, argument in enumerate(func._schema.arguments):
        if argument.name == "size":
            if i < len(args):
                return (*args[:i], size, *args[i + 1 :]), kwargs
            return args, {**kwargs, "size": size}
    raise NotSliceable(None, f"{func} has no size argument")


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
