"""``describe``: input descriptors for a whole signature, from example calls.

Per tensor, properties equal in every call are kept (as in
:meth:`MetaTensorType.from_examples`); across tensors, lengths that vary but
are equal to each other in every call share one symbolic name, so
``x: (b, 10)`` and ``mask: (b,)`` come out as ``["d0", 10]`` and ``["d0"]``.
Non-tensor arguments equal in every call become values; otherwise types.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from torchdefer.descriptors.meta_tensor_type import MetaTensorType, _common, _join_devices

__all__ = ["describe"]


def describe(fn: torch.nn.Module | Callable[..., Any], *example_calls: Any) -> dict[str, Any]:
    """The most specific input descriptors that every example call satisfies.

    Args:
        fn: a module (its ``forward``) or a function.
        *example_calls: each a tuple of positional arguments or a dict of
            keyword arguments.

    Returns:
        ``input_descriptors`` ready for :func:`~torchdefer.script`.

    Example:
        >>> import torch
        >>> def f(x, mask, flag):
        ...     return x
        >>> d = describe(f, (torch.zeros(2, 4), torch.ones(2), True),
        ...                 (torch.zeros(5, 4), torch.ones(5), True))
        >>> d["x"].shape, d["mask"].shape, d["flag"]
        (('d0', 4), ('d0',), True)
    """
    if not example_calls:
        raise ValueError("describe() needs at least one example call")
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    sig = inspect.signature(target)
    bound = []
    for i, call in enumerate(example_calls):
        try:
            b = sig.bind(**call) if isinstance(call, Mapping) else sig.bind(*call)
        except TypeError as e:
            raise TypeError(f"describe(): example call {i} does not fit {sig}: {e}") from e
        bound.append(dict(b.arguments))
    names = [n for n in sig.parameters if all(n in b for b in bound)]
    tensors: list[tuple[str, list[torch.Tensor]]] = []
    skeleton = {n: _skeleton([b[n] for b in bound], n, tensors) for n in names}
    descs = _tensor_descriptors(tensors)
    return {n: _fill(skeleton[n], descs) for n in names}


def _skeleton(values: list[Any], path: str, tensors: list[tuple[str, list[torch.Tensor]]]) -> Any:
    first = values[0]
    if all(isinstance(v, torch.Tensor) for v in values):
        tensors.append((path, values))
        return _TensorSlot(len(tensors) - 1)
    if isinstance(first, (tuple, list)) and all(
        type(v) is type(first) and len(v) == len(first) for v in values
    ):
        items = [
            _skeleton([v[i] for v in values], f"{path}[{i}]", tensors) for i in range(len(first))
        ]
        return tuple(items) if isinstance(first, tuple) else items
    if isinstance(first, dict) and all(
        isinstance(v, dict) and v.keys() == first.keys() for v in values
    ):
        return {k: _skeleton([v[k] for v in values], f"{path}[{k!r}]", tensors) for k in first}
    if all(type(v) is type(first) and v == first for v in values):
        return first
    kinds = {type(v) for v in values}
    if len(kinds) == 1 and kinds <= {int, float, bool, str}:
        return kinds.pop()
    if kinds <= {int, float}:
        return float
    raise TypeError(
        f"describe(): {path} differs in kind or structure across example calls "
        f"({', '.join(sorted(k.__name__ for k in kinds))}); describe it by hand"
    )


class _TensorSlot:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _tensor_descriptors(tensors: list[tuple[str, list[torch.Tensor]]]) -> list[MetaTensorType]:
    names: dict[tuple[int, ...], str] = {}
    counter = itertools.count()
    out = []
    for _, examples in tensors:
        ranks = {t.dim() for t in examples}
        shape = None
        if len(ranks) == 1:
            shape = []
            for column in zip(*(tuple(t.shape) for t in examples), strict=True):
                if len(set(column)) == 1:
                    shape.append(column[0])
                else:
                    if column not in names:
                        names[column] = f"d{next(counter)}"
                    shape.append(names[column])
        out.append(
            MetaTensorType(
                shape,
                _common(t.dtype for t in examples),
                rank=_common(t.dim() for t in examples),
                device=_join_devices(t.device for t in examples),
                requires_grad=_common(t.requires_grad for t in examples),
                layout=_common(t.layout for t in examples),
            )
        )
    return out


def _fill(node: Any, descs: list[MetaTensorType]) -> Any:
    if isinstance(node, _TensorSlot):
        return descs[node.index]
    if isinstance(node, (tuple, list)):
        items = [_fill(c, descs) for c in node]
        return tuple(items) if isinstance(node, tuple) else items
    if isinstance(node, dict):
        return {k: _fill(c, descs) for k, c in node.items()}
    return node
