"""Outputs: flattened for the graph, rebuilt for the caller, described.

A graph returns a flat tuple; models return nested structures, some of whose
classes ``torch.utils._pytree`` knows (tuple, dict, ``ModelOutput``) and some
it does not (``DynamicCache`` in Hugging Face default configs, which export
alone refuses). :meth:`OutputRecipe.capture` records, at trace time, how to
rebuild an output from the graph's flat outputs: pytree's ``TreeSpec`` for
registered containers; for an object of an unregistered class, its class and
its attributes (``vars``), walked the same way; non-tensor leaves (``None``,
a flag, a dtype) are kept as they were. :meth:`OutputRecipe.rebuild` runs it
backwards on every call.

:meth:`OutputRecipe.describe` gives ``Program.output_descriptors`` the
outputs' own structure, but never runs the model's classes on descriptors: an
``unflatten`` or ``__init__`` may reject what is not a tensor (``P holds
tensors``), or compute from its inputs. Python's and torch's own containers
(tuple, list, dict, namedtuple, ``torch.return_types``) are rebuilt; any other
object becomes an :class:`ObjectOf`: its class and its children's descriptors,
named by the keys its pytree registration gives (``.logits``), which the
recipe records at trace time from the real object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree

from torchdefer._compat.export import spec_children
from torchdefer.descriptors._expr import treespec
from torchdefer.descriptors._meta_tensor_type import SCALARS, DimRange, MetaTensorType
from torchdefer.descriptors._object_of import (
    KEYS,
    ObjectOf,
    key_kind,
    key_value,
    node_keys,
    plain,
    unflatten,
)
from torchdefer.descriptors._tree import TypeOf, from_json, to_json
from torchdefer.errors import UsageError, UsageTypeError

__all__ = ["OutputRecipe", "describe_output"]

_GRAPH = "graph"  # a leaf the graph computes
_SYMBOLIC = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)
@dataclass(frozen=True, slots=True)
class _Const:
    value: Any


@dataclass(frozen=True, slots=True)
class _Object:
    cls: type
    attrs: OutputRecipe  # the recipe of ``vars(obj)``


@dataclass(frozen=True, slots=True)
class OutputRecipe:
    """How to rebuild a model's output from a graph's flat outputs: its pytree
    structure (unregistered objects are leaves) and, per leaf, ``"graph"`` (the
    next graph output), a constant, or an unregistered object to rebuild;
    ``keys``: per container of a class not ``plain``, in pre-order, its
    children's pytree keys (names for :class:`ObjectOf`; empty: by position)."""

    spec: pytree.TreeSpec
    slots: tuple[Any, ...]
    keys: tuple[tuple[Any, ...], ...] = ()

    @classmethod
    def capture(cls, out: Any) -> tuple[list[Any], OutputRecipe]:
        """``out``'s graph leaves (tensors, symbolic ints) and its recipe."""
        leaves, spec = pytree.tree_flatten(out)
        flat: list[Any] = []
        slots: list[Any] = []
        for leaf in leaves:
            if isinstance(leaf, _SYMBOLIC):
                flat.append(leaf)
                slots.append(_GRAPH)
            elif isinstance(leaf, SCALARS):
                slots.append(_Const(leaf))
            elif hasattr(leaf, "__dict__") and not isinstance(leaf, type):
                sub, recipe = cls.capture(dict(vars(leaf)))
                flat.extend(sub)
                slots.append(_Object(type(leaf), recipe))
            else:
                slots.append(_Const(leaf))  # functions, classes: kept by reference
        return flat, cls(spec, tuple(slots), tuple(node_keys(out, spec)))

    def rebuild(self, flat: Iterator[Any]) -> Any:
        """The output with graph leaves taken in order from ``flat``."""
        if self.spec.is_leaf() and self.slots[0] is _GRAPH:
            return next(flat)

        def build(slot: _Object) -> Any:
            obj: Any = object.__new__(slot.cls)  # no __init__: the attributes are the state
            obj.__dict__.update(slot.attrs.rebuild(flat))
            return obj

        return pytree.tree_unflatten(self._leaves(flat, build), self.spec)

    def describe(self, flat: Iterator[Any]) -> Any:
        """The output's descriptor, graph leaves' descriptors taken in order
        from ``flat``: like :meth:`rebuild`, but objects of the model's
        classes are :class:`ObjectOf`, never built."""
        def describe(slot: _Object) -> Any:
            attrs = slot.attrs.describe(flat)  # a dict
            return ObjectOf(slot.cls, tuple(map(pytree.GetAttrKey, attrs)), tuple(attrs.values()))

        return unflatten(self.spec, iter(self._leaves(flat, describe)), iter(self.keys))

    def _leaves(self, flat: Iterator[Any], obj: Callable[[_Object], Any]) -> list[Any]:
        """The pytree leaves: graph leaves from ``flat``, constants, and ``obj(slot)``
        for an object of the model's classes (it takes its own leaves from ``flat``)."""
        return [next(flat) if slot is _GRAPH
                else slot.value if isinstance(slot, _Const)
                else obj(slot) for slot in self.slots]

    def to_json(self) -> dict[str, Any]:
        """JSON form; raises ``TypeError`` for what a file cannot name safely
        (unregistered classes), saying what to register or return instead."""
        objects = [s.cls for s in self.slots if isinstance(s, _Object)]
        if objects:
            raise UsageTypeError(
                f"the program's outputs hold a {objects[0].__module__}.{objects[0].__qualname__}, "
                "which torch.utils._pytree does not know, so a file cannot rebuild it without "
                "running code; register it with torch.utils._pytree.register_pytree_node(..., "
                "serialized_type_name=...) (for transformers caches: transformers.integrations."
                "executorch.register_dynamic_cache_export_support()) before script(), or return "
                "tensors")
        try:
            slots = [_GRAPH if s is _GRAPH else {"const": to_json(s.value)} for s in self.slots]
        except TypeError as e:
            raise UsageTypeError(f"the program's outputs hold a constant that {e}") from None
        keys = [[_key_json(k, i) for i, k in enumerate(node)] for node in self.keys]
        return {"spec": pytree.treespec_dumps(self.spec), "slots": slots, "keys": keys}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OutputRecipe:
        """Inverse of :meth:`to_json`: containers only of types registered in this process."""
        slots = [_GRAPH if s == _GRAPH else _Const(from_json(s["const"])) for s in data["slots"]]
        spec = treespec(data["spec"])
        if len(slots) != spec.num_leaves:
            raise UsageError(f"{len(slots)} slots for {spec.num_leaves} leaves")
        keys = tuple(tuple(_key_from_json(k) for k in node) for node in data.get("keys", ()))
        if keys and [len(k) for k in keys] != [len(spec_children(s)) for s in _objects(spec)]:
            raise UsageError(f"output keys {keys} do not fit the structure {spec}")
        return cls(spec, tuple(slots), keys)


def _objects(spec: pytree.TreeSpec) -> list[pytree.TreeSpec]:
    """The container specs of classes not ``plain``, in pre-order."""
    if spec.is_leaf():
        return []
    own = [] if plain(spec.type) else [spec]
    return own + [s for child in spec_children(spec) for s in _objects(child)]


def _key_json(key: Any, position: int) -> list[Any]:
    kind = key_kind(key)
    try:
        return [kind, to_json(key_value(key))]
    except TypeError:  # a key a file cannot hold: read back by position
        return ["index", position]


def _key_from_json(data: Any) -> Any:
    kind, value = data
    cls, _ = KEYS[kind]
    value = from_json(value)
    if {"attr": str, "index": int}.get(kind, type(value)) is not type(value):
        raise UsageError(f"output key {data!r}")
    return cls(value)


def describe_output(val: Any, names: Mapping[str, str | None],
                    ranges: Mapping[str, DimRange]) -> Any:
    """The descriptor of one graph output (its fake value), in the inputs' names
    (``names``: export symbol -> descriptor name, ``None`` for an any-length dim)."""
    if isinstance(val, torch.Tensor):
        shape = [_dim(s, names) for s in val.shape]
        named = {d for d in shape if isinstance(d, str)}
        return MetaTensorType(shape, val.dtype, device=val.device, layout=val.layout,
                              dim_ranges={n: r for n, r in ranges.items() if n in named})
    if isinstance(val, torch.SymInt):
        return TypeOf(int)
    return MetaTensorType() if val is None else TypeOf(type(val))


def _dim(size: Any, names: Mapping[str, str | None]) -> int | str | None:
    if not isinstance(size, torch.SymInt):
        return int(size)
    expr = size.node.expr
    if expr.is_Integer:
        return int(expr)
    if any(names.get(s.name) is None for s in expr.free_symbols):
        return None
    return str(expr.xreplace({s: sympy.Symbol(names[s.name]) for s in expr.free_symbols}))
