"""Descriptor trees: one argument's descriptor, nested like the argument itself.

A user writes a descriptor per parameter: a :class:`MetaTensorType`, a plain
Python value (value specialization), a typing object (``int``, ``List[int]``,
``list[MetaTensorType]``, ``Optional[...]``, as the RFC lists), or a tuple /
list / dict of these shaped like the argument (seed 003's "spec formatted the
way the function is called"). :func:`normalize` turns it into a
``torch.utils._pytree`` tree whose containers are the argument's own (any type
registered with pytree) and whose leaves are ``MetaTensorType`` or one of the
classes below. Paths in messages are the parameter name plus ``pytree.keystr``
(``inp['b'][1]``).
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
import torch.utils._pytree as pytree

from torchdefer.descriptors.meta_tensor_type import SCALARS, MetaTensorType

__all__ = ["ListOf", "Node", "OptionalOf", "TypeOf", "Value", "from_json", "normalize", "to_json",
           "value_from_json", "value_to_json"]

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

    def __repr__(self) -> str:
        return self.type.__name__


@dataclass(frozen=True, slots=True)
class ListOf:
    """A list of any length whose elements each satisfy ``element`` (``List[int]``)."""

    element: Any

    def __repr__(self) -> str:
        return f"List[{self.element!r}]"


@dataclass(frozen=True, slots=True)
class OptionalOf:
    """``None``, or what ``inner`` admits (``Optional[MetaTensorType]``)."""

    inner: Any

    def __repr__(self) -> str:
        return f"Optional[{self.inner!r}]"


LEAVES = (MetaTensorType, Value, TypeOf, ListOf, OptionalOf)
Node: TypeAlias = Any
"""A normalized descriptor: one of ``LEAVES`` or a pytree container of nodes."""


def normalize(descriptor: Any, path: str) -> Node:
    """Turn a user's descriptor for the argument at ``path`` into a tree.

    Raises:
        TypeError: for a tensor (use ``MetaTensorType``), an unsupported type or object.

    Example:
        >>> from typing import List, Optional
        >>> normalize({"ids": List[int], "mask": Optional[MetaTensorType]}, "inp")
        {'ids': List[int], 'mask': Optional[MetaTensorType()]}
    """
    with_paths, spec = pytree.tree_flatten_with_path(descriptor, is_leaf=lambda x: x is None)
    leaves = [_leaf(leaf, path + pytree.keystr(kp)) for kp, leaf in with_paths]
    return pytree.tree_unflatten(leaves, spec)


def _leaf(d: Any, path: str) -> Node:
    if isinstance(d, LEAVES):
        return d
    if d is MetaTensorType or d is torch.Tensor:
        return MetaTensorType()
    origin, args = typing.get_origin(d), typing.get_args(d)
    if origin is list and len(args) == 1:
        return ListOf(normalize(args[0], f"{path}[i]"))
    if origin is tuple and args and args[-1] is not Ellipsis:
        return tuple(normalize(a, f"{path}[{i}]") for i, a in enumerate(args))
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner = next(a for a in args if a is not type(None))
        return OptionalOf(normalize(inner, path))
    if isinstance(d, type) and d.__name__ in _TYPES and _TYPES[d.__name__] is d:
        return TypeOf(d)
    if isinstance(d, torch.Tensor):
        raise TypeError(
            f"input descriptor for {path} is a tensor; describe tensors with MetaTensorType(...) "
            f"(MetaTensorType.from_examples(t) builds one from an example)")
    if isinstance(d, SCALARS):
        return Value(d)
    raise TypeError(
        f"input descriptor for {path} is {d!r}; expected a MetaTensorType, a type (int, float, "
        "bool, str, torch.Tensor, List[...], Tuple[...], Optional[...]), a plain value (None, "
        "bool, int, float, str, torch.dtype, torch.device) or a tuple/list/dict of these")


# ------------------------------------------------------------------- JSON
def to_json(node: Node) -> dict[str, Any]:
    """A JSON-ready form of the tree: containers by ``pytree.treespec_dumps``
    (types by their registered ``serialized_type_name``), leaves as plain data."""
    leaves, spec = pytree.tree_flatten(node)
    return {"spec": pytree.treespec_dumps(spec), "leaves": [_leaf_to_json(x) for x in leaves]}


def from_json(data: dict[str, Any]) -> Node:
    """Inverse of :func:`to_json`; builds only descriptor objects and containers
    registered with pytree in this process, never runs code from ``data``."""
    spec = pytree.treespec_loads(data["spec"])
    return pytree.tree_unflatten([_leaf_from_json(x) for x in data["leaves"]], spec)


def _leaf_to_json(leaf: Node) -> dict[str, Any]:
    if isinstance(leaf, MetaTensorType):
        return {"tensor": leaf.to_json()}
    if isinstance(leaf, TypeOf):
        return {"type": leaf.type.__name__}
    if isinstance(leaf, ListOf):
        return {"list": to_json(leaf.element)}
    if isinstance(leaf, OptionalOf):
        return {"optional": to_json(leaf.inner)}
    return value_to_json(leaf.value)


def _leaf_from_json(data: dict[str, Any]) -> Node:
    (kind, payload), = data.items()
    if kind == "tensor":
        return MetaTensorType.from_json(payload)
    if kind == "type" and payload in _TYPES:
        return TypeOf(_TYPES[payload])
    if kind in ("list", "optional"):
        return (ListOf if kind == "list" else OptionalOf)(from_json(payload))
    return Value(value_from_json(data))


def value_to_json(value: Any) -> dict[str, Any]:
    """A plain value (scalar, dtype, device, layout) as JSON; raises for others."""
    if isinstance(value, (torch.dtype, torch.layout, torch.device)):
        return {type(value).__name__: str(value).removeprefix("torch.")}
    json.dumps(value)  # raises for what JSON cannot hold
    return {"value": value}


def value_from_json(data: dict[str, Any]) -> Any:
    """Inverse of :func:`value_to_json`; looks names up on ``torch`` only."""
    ((kind, payload),) = data.items()
    if kind in ("dtype", "layout") and isinstance(getattr(torch, payload, None),
                                                  getattr(torch, kind)):
        return getattr(torch, payload)
    if kind == "device":
        return torch.device(payload)
    if kind == "value" and isinstance(payload, SCALARS):
        return payload
    raise ValueError(f"unknown value {data!r}")
