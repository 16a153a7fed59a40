"""Descriptor trees: one argument's descriptor, nested like the argument itself.

A user writes a descriptor per parameter: a :class:`MetaTensorType`, a plain
Python value (value specialization), a typing object (``int``, ``List[int]``,
``list[MetaTensorType]``, ``Optional[...]``), or a tuple /
list / dict of these shaped like the argument (the descriptors are written
the way the function is called). :func:`parameters` binds them to the signature
and :func:`normalize` turns each into a ``torch.utils._pytree`` tree whose
containers are the argument's own (any type registered with pytree) and whose
leaves are ``MetaTensorType`` or one of the classes below. Paths in messages
are the parameter name plus ``pytree.keystr`` (``inp['b'][1]``).
:func:`to_json` / :func:`from_json` are the program file's one format.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeAlias, Union

import torch
import torch.utils._pytree as pytree

from torchdefer.descriptors._expr import treespec
from torchdefer.descriptors._meta_tensor_type import SCALARS, MetaTensorType
from torchdefer.descriptors._object_of import ObjectOf
from torchdefer.errors import UsageError, UsageTypeError

__all__ = ["Descriptor", "ListOf", "Node", "OptionalOf", "Param", "TypeOf", "Value", "from_json",
           "normalize", "parameters", "tensors", "to_json"]

_TYPES: dict[str, type] = {t.__name__: t for t in (int, float, bool, str)}


@dataclass(frozen=True, slots=True)
class Value:
    """Value specialization: the argument must equal ``value`` (same type)."""

    value: Any

    def __post_init__(self) -> None:
        if not isinstance(self.value, SCALARS):
            raise UsageError(f"Value takes a plain value, got a {type(self.value).__name__}")

    def __repr__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True, slots=True)
class TypeOf:
    """Type specialization: any value of this type (``int`` excludes ``bool``)."""

    type: type

    def __post_init__(self) -> None:
        if _TYPES.get(getattr(self.type, "__name__", "")) is not self.type:
            raise UsageError(f"TypeOf takes one of {list(_TYPES)}, got {self.type!r}")

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
Descriptor: TypeAlias = Union[  # typing.Union: its quoted (recursive) members
    MetaTensorType, ObjectOf, TypeOf, ListOf, OptionalOf, Value,
    "tuple[Descriptor, ...]", "list[Descriptor]", "dict[Hashable, Descriptor]",
    bool, int, float, complex, str, torch.dtype, torch.device, None,
]
"""What :func:`~torchdefer.describe` gives per parameter: a leaf, a plain value it
fixes, or a container of descriptors shaped like the argument."""
Node: TypeAlias = Any
"""A normalized descriptor: one of ``LEAVES`` or a pytree container of nodes."""


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of the scripted callable: ``kind`` is an ``inspect`` kind's
    name; ``node`` is ``None`` when the default is not a plain value (a tensor:
    the program keeps it and refuses a passed value); ``default`` is
    ``inspect.Parameter.empty`` unless a plain value; an undescribed parameter
    is fixed to its default."""

    name: str
    kind: str
    node: Node | None
    default: Any = inspect.Parameter.empty
    described: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and type(self.described) is bool and self.kind in (
                "POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")):
            raise UsageError(f"not a parameter: {self.name!r} {self.kind!r} {self.described!r}")


def parameters(fn: Callable[..., Any],
               descriptors: Mapping[str, Any]) -> tuple[str, tuple[Param, ...]]:
    """``fn``'s name and parameters (``*args``/``**kwargs`` left out), each
    with its descriptor tree; raises ``TypeError`` for what does not fit."""
    if not isinstance(descriptors, Mapping):
        raise UsageTypeError(
            "input_descriptors must be a dict from parameter name to descriptor, got "
            f"{type(descriptors).__name__}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise UsageTypeError(f"cannot read the signature of {fn!r}: {e}") from e
    qualname = getattr(fn, "__qualname__", type(fn).__name__)
    accepted = [p for p in signature.parameters.values()
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    unknown = [k for k in descriptors if k not in {p.name for p in accepted}]
    if unknown:
        raise UsageTypeError(f"input_descriptors names {unknown} but {qualname}() has parameters "
                             f"{[p.name for p in accepted]} (*args/**kwargs cannot be described)")
    params = []
    for p in accepted:
        plain = p.default is not p.empty and all(
            isinstance(v, SCALARS) for v in pytree.tree_leaves(p.default))
        if p.name not in descriptors and p.default is p.empty:
            raise UsageTypeError(
                f"parameter {p.name!r} of {qualname}() has no default and no input "
                f"descriptor; add input_descriptors[{p.name!r}]")
        node = (normalize(descriptors[p.name], p.name) if p.name in descriptors
                else normalize(p.default, p.name) if plain else None)
        params.append(Param(p.name, p.kind.name, node, p.default if plain else p.empty,
                            p.name in descriptors))
    return qualname, tuple(params)


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
        return OptionalOf(normalize(next(a for a in args if a is not type(None)), path))
    if isinstance(d, type) and _TYPES.get(d.__name__) is d:
        return TypeOf(d)
    if isinstance(d, torch.Tensor):
        raise UsageTypeError(
            f"input descriptor for {path} is a tensor; describe tensors with MetaTensorType(...) "
            f"(MetaTensorType.from_examples(t) builds one from an example)")
    if isinstance(d, SCALARS):
        return Value(d)
    raise UsageTypeError(
        f"input descriptor for {path} is {d!r}; expected a MetaTensorType, a type (int, float, "
        "bool, str, torch.Tensor, List[...], Tuple[...], Optional[...]), a plain value (None, "
        "bool, int, float, str, torch.dtype, torch.device) or a tuple/list/dict of these")


def tensors(node: Node) -> list[MetaTensorType]:
    """Every ``MetaTensorType`` in a tree, inside ``List``/``Optional`` too."""
    out = []
    for leaf in pytree.tree_leaves(node):
        if isinstance(leaf, (ListOf, OptionalOf)):
            out += tensors(leaf.element if isinstance(leaf, ListOf) else leaf.inner)
        elif isinstance(leaf, MetaTensorType):
            out.append(leaf)
    return out


# ------------------------------------------------------------------- JSON
_CLASSES = {c.__name__: c for c in (*LEAVES, Param)}
_TORCH = {"dtype": torch.dtype, "layout": torch.layout}


def to_json(x: Any) -> Any:
    """A JSON-ready form of a tree, a ``Param`` or a plain value: this
    package's classes by field, dtypes/layouts/devices/types by name, other
    containers by ``pytree.treespec_dumps`` (types by their registered
    ``serialized_type_name``); raises ``TypeError`` for anything else."""
    if x is None or type(x) in (bool, int, float, str):
        return x
    if isinstance(x, (torch.dtype, torch.layout, torch.device)):
        return {type(x).__name__: str(x).removeprefix("torch.")}
    if x is inspect.Parameter.empty:
        return {"empty": None}
    if isinstance(x, type) and _TYPES.get(x.__name__) is x:
        return {"type": x.__name__}
    if type(x) in _CLASSES.values():
        return {type(x).__name__: {f.name: to_json(getattr(x, f.name)) for f in fields(x)}}
    if type(x) in (list, tuple):
        return {type(x).__name__: [to_json(v) for v in x]}
    if isinstance(x, ObjectOf):
        raise UsageTypeError(
            f"{x!r} cannot be saved in a program file: it describes a {x.type.__qualname__} "
            "without building one, which a file cannot name; save a program whose inputs are "
            "tensors, plain values and containers registered with torch.utils._pytree")
    leaves, spec = pytree.tree_flatten(x, is_leaf=lambda v: isinstance(v, ObjectOf))
    try:
        text = None if spec.is_leaf() else pytree.treespec_dumps(spec)
        if text is None or treespec(text) != spec:
            raise UsageError
    except Exception:  # what loading would refuse or read back otherwise
        raise UsageTypeError(
            f"{x!r} (a {type(x).__name__}) cannot be saved in a program file, which holds "
            "plain values (None, bool, int, float, str), torch dtypes, layouts and devices, "
            "and containers registered with torch.utils._pytree") from None
    return {"tree": text, "leaves": [to_json(v) for v in leaves]}


def from_json(data: Any) -> Any:
    """Inverse of :func:`to_json`. Builds only this package's classes (which
    check their fields), names looked up on ``torch`` and containers
    registered with pytree in this process (``_expr.treespec``): never runs
    code from ``data``."""
    if data is None or type(data) in (bool, int, float, str):
        return data
    if data.keys() == {"tree", "leaves"}:
        spec = treespec(data["tree"])
        return pytree.tree_unflatten([from_json(v) for v in data["leaves"]], spec)
    ((kind, payload),) = data.items()
    if kind in ("list", "tuple"):
        return {"list": list, "tuple": tuple}[kind](from_json(v) for v in payload)
    # vars(), not getattr: a name the file chose must not reach torch's lazy submodule imports.
    if kind in _TORCH and isinstance(payload, str) and isinstance(
            vars(torch).get(payload), _TORCH[kind]):
        return vars(torch)[payload]
    if kind in ("device", "type", "empty"):
        return (torch.device(payload) if kind == "device" else _TYPES[payload] if kind == "type"
                else inspect.Parameter.empty)
    return _CLASSES[kind](**{name: from_json(v) for name, v in payload.items()})
