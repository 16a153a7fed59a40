"""Descriptor trees: one argument's descriptor, nested like the argument itself.

A user writes a descriptor per parameter: a :class:`MetaTensorType`, a plain
Python value (value specialization), a type (``int``), or a tuple / list /
dict of these shaped like the argument (seed 003's "spec formatted the way the
function is called"). :func:`normalize` turns that into a tree whose leaves
are :class:`MetaTensorType`, :class:`Value` or :class:`TypeOf`, and whose
inner nodes are real ``tuple`` / ``list`` / ``dict`` objects, so the tree
prints like the call. :func:`leaves` walks it in argument order with each
leaf's path (``inp['b'][1]``), the order in which symbols are bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch

from torchdefer.descriptors.meta_tensor_type import MetaTensorType

__all__ = [
    "Leaf",
    "Node",
    "TypeOf",
    "Value",
    "from_json",
    "is_constant",
    "leaves",
    "normalize",
    "rebuild",
    "to_json",
]

# Scalar types a value leaf may hold; collections of them are trees of leaves.
_SCALARS = (type(None), bool, int, float, str, torch.dtype, torch.device)
# Types a TypeOf leaf may name: what TorchScript and torch.export can take.
_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


@dataclass(frozen=True, slots=True)
class Value:
    """Value specialization: the argument must equal ``value`` (same type)."""

    value: Any

    def __repr__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True, slots=True)
class TypeOf:
    """Type specialization: any value of this type (``int`` excludes ``bool``)."""

    type: type

    def admits(self, value: Any) -> bool:
        if self.type is float:
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.type is int:
            return isinstance(value, int) and not isinstance(value, bool)
        return isinstance(value, self.type)

    def __repr__(self) -> str:
        return self.type.__name__


Leaf: TypeAlias = MetaTensorType | Value | TypeOf
Node: TypeAlias = Leaf | tuple[Any, ...] | list[Any] | dict[Any, Any]


def normalize(descriptor: Any, path: str) -> Node:
    """Turn a user's descriptor for the argument at ``path`` into a tree.

    Raises:
        TypeError: for a tensor (use ``MetaTensorType``) or an unsupported object.
    """
    if isinstance(descriptor, (MetaTensorType, Value, TypeOf)):
        return descriptor
    if descriptor is torch.Tensor:
        return MetaTensorType()
    if isinstance(descriptor, type):
        if descriptor not in _TYPES.values():
            raise TypeError(
                f"input descriptor for {path} is the type {descriptor.__name__}; supported "
                f"types are {', '.join(_TYPES)} and torch.Tensor"
            )
        return TypeOf(descriptor)
    if isinstance(descriptor, torch.Tensor):
        raise TypeError(
            f"input descriptor for {path} is a tensor; describe tensors with MetaTensorType(...) "
            f"(MetaTensorType.from_examples(t) builds one from an example)"
        )
    if isinstance(descriptor, (tuple, list)):
        items = [normalize(d, f"{path}[{i}]") for i, d in enumerate(descriptor)]
        return tuple(items) if isinstance(descriptor, tuple) else items
    if isinstance(descriptor, dict):
        return {k: normalize(d, f"{path}[{k!r}]") for k, d in descriptor.items()}
    if isinstance(descriptor, _SCALARS):
        return Value(descriptor)
    raise TypeError(
        f"input descriptor for {path} is a {type(descriptor).__name__}; expected a "
        "MetaTensorType, a type (int, float, bool, str), a plain value (None, bool, int, float, "
        "str, torch.dtype, torch.device) or a tuple/list/dict of these"
    )


def leaves(node: Node, path: str) -> Iterator[tuple[str, Leaf]]:
    """Every leaf of ``node`` with its path, in argument order."""
    if isinstance(node, (tuple, list)):
        for i, child in enumerate(node):
            yield from leaves(child, f"{path}[{i}]")
    elif isinstance(node, dict):
        for key, child in node.items():
            yield from leaves(child, f"{path}[{key!r}]")
    else:
        yield path, node


def is_constant(node: Node) -> bool:
    """Whether every leaf is a :class:`Value` (the whole argument is fixed)."""
    return all(isinstance(leaf, Value) for _, leaf in leaves(node, ""))


def rebuild(node: Node, dynamic: Iterator[Any]) -> Any:
    """The argument ``node`` describes, with values filled in and other leaves
    taken in order from ``dynamic`` (the inverse of walking :func:`leaves`)."""
    if isinstance(node, (tuple, list)):
        items = [rebuild(child, dynamic) for child in node]
        return tuple(items) if isinstance(node, tuple) else items
    if isinstance(node, dict):
        return {key: rebuild(child, dynamic) for key, child in node.items()}
    if isinstance(node, Value):
        return node.value
    return next(dynamic)


# ------------------------------------------------------------------- JSON
def to_json(node: Node) -> dict[str, Any]:
    """A JSON-ready form of the tree; :func:`from_json` reads it back."""
    if isinstance(node, MetaTensorType):
        return {"kind": "tensor", "meta": node.to_json()}
    if isinstance(node, TypeOf):
        return {"kind": "type", "type": node.type.__name__}
    if isinstance(node, Value):
        return _value_to_json(node.value)
    if isinstance(node, dict):
        for key in node:
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(f"dict descriptor key {key!r} cannot be saved; use str or int keys")
        return {"kind": "dict", "items": [[k, to_json(v)] for k, v in node.items()]}
    kind = "tuple" if isinstance(node, tuple) else "list"
    return {"kind": kind, "items": [to_json(v) for v in node]}


def from_json(data: dict[str, Any]) -> Node:
    """Inverse of :func:`to_json`; builds only descriptor objects, never runs code."""
    kind = data["kind"]
    if kind == "tensor":
        return MetaTensorType.from_json(data["meta"])
    if kind == "type":
        if data["type"] not in _TYPES:
            raise ValueError(f"unknown type descriptor {data['type']!r} in saved program")
        return TypeOf(_TYPES[data["type"]])
    if kind == "value":
        return Value(data["value"])
    if kind == "dtype":
        dtype = getattr(torch, data["value"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {data['value']!r} in saved program")
        return Value(dtype)
    if kind == "device":
        return Value(torch.device(data["value"]))
    if kind == "dict":
        return {k: from_json(v) for k, v in data["items"]}
    if kind in ("tuple", "list"):
        items = [from_json(v) for v in data["items"]]
        return tuple(items) if kind == "tuple" else items
    raise ValueError(f"unknown descriptor kind {kind!r} in saved program")


def _value_to_json(value: Any) -> dict[str, Any]:
    if isinstance(value, torch.dtype):
        return {"kind": "dtype", "value": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"kind": "device", "value": str(value)}
    return {"kind": "value", "value": value}
