"""``ObjectOf``: the descriptor of an object of the model's own classes.

A descriptor tree of an output or an input may hold objects of classes that
are not Python's or torch's containers (``ModelOutput``, a cache, a user's
pytree-registered class). Building one around descriptor objects runs the
class's code -- an ``__init__`` or pytree unflatten that may refuse what is
not a tensor (``P holds tensors``) or compute from it -- so such a node is an
:class:`ObjectOf` instead: the class, its children, their pytree keys and
the class's flatten context. :func:`unflatten` is ``tree_unflatten`` that
builds these; :func:`real_spec` turns them back into the class's own spec
where real arguments are flattened or rebuilt (on tensors, as the model's
code would).
"""

from __future__ import annotations

import contextlib
from collections import namedtuple
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch.utils._pytree as pytree

from torchdefer._compat.export import spec_children
from torchdefer.errors import LookupAttributeError, LookupKeyError

__all__ = ["KEYS", "ObjectOf", "key_kind", "key_value", "node_keys", "plain", "real_spec",
           "unflatten"]

KEYS = {"attr": (pytree.GetAttrKey, "name"), "item": (pytree.MappingKey, "key"),
        "index": (pytree.SequenceKey, "idx")}


@dataclass(frozen=True, slots=True)
class ObjectOf:
    """The descriptor of an object of a class other than Python's and torch's
    containers, never built from descriptors (its ``__init__`` or pytree
    unflatten may refuse them, or compute from them): its class, its
    children's descriptors, each under its pytree key (``GetAttrKey``,
    ``MappingKey`` or ``SequenceKey``), and, for a pytree-registered class,
    the context its flatten gives (what an argument's must equal).

    Outputs are described so (``Program.output_descriptors``), and so are
    inputs by :func:`~torchdefer.describe`. Read a child as the object's
    attribute or item: ``.logits``, ``["out"]``.

    Example:
        >>> import dataclasses, torch, torchdefer
        >>> from torchdefer.descriptors import MetaTensorType
        >>> @dataclasses.dataclass
        ... class Out:
        ...     logits: torch.Tensor
        >>> torch.utils._pytree.register_dataclass(Out, serialized_type_name="doc.Out")
        >>> x = MetaTensorType(["b", 4], torch.float32)
        >>> p = torchdefer.script(lambda x: Out(x * 2), {"x": x})
        >>> p.output_descriptors.logits.shape
        ('b', 4)
        >>> type(p(torch.ones(3, 4))).__name__
        'Out'
    """

    type: type
    keys: tuple[pytree.KeyEntry, ...]
    children: tuple[object, ...]  # descriptors (tree.Descriptor), shaped like the object's
    context: object = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("type", "keys", "children", "context"):
            raise AttributeError(name)  # also while copy/pickle build the object
        for key, child in zip(self.keys, self.children):
            if key_value(key) == name and not isinstance(key, pytree.SequenceKey):
                return child
        raise LookupAttributeError(f"the descriptor of a {self.type.__qualname__} has no "
                                   f"{name!r}; it has {self._names()}")

    def __getitem__(self, name: Any) -> Any:
        for key, child in zip(self.keys, self.children):
            if key_value(key) == name and type(key_value(key)) is type(name):
                return child
        raise LookupKeyError(f"the descriptor of a {self.type.__qualname__} has no {name!r}; "
                             f"it has {self._names()}")

    def _names(self) -> str:
        return ", ".join(pytree.keystr((k,)) for k in self.keys) or "no children"

    def __repr__(self) -> str:
        items = ", ".join(f"{pytree.keystr((k,))}: {c!r}" for k, c in zip(self.keys, self.children))
        return f"ObjectOf({self.type.__module__}.{self.type.__qualname__}, {{{items}}})"


def key_value(key: Any) -> Any:
    return getattr(key, KEYS[key_kind(key)][1])


def key_kind(key: Any) -> str:
    return next(kind for kind, (cls, _) in KEYS.items() if isinstance(key, cls))


def plain(kind: Any) -> bool:
    """Containers whose rebuilding runs no code of the model's (namedtuples
    are built with ``tuple.__new__``, past a class's own ``__new__``)."""
    return kind in pytree.BUILTIN_TYPES or getattr(kind, "__module__", None) == "torch.return_types"




def node_keys(obj: Any, spec: pytree.TreeSpec) -> list[tuple[Any, ...]]:
    """Per container in ``spec`` (the structure of ``obj``) of a class not
    :func:`plain`, in pre-order, its children's keys from its pytree
    registration; positions where it gives none."""
    if spec.is_leaf():
        return []
    node = pytree.SUPPORTED_NODES[spec.type]
    children = node.flatten_fn(obj)[0]
    out = []
    if not plain(spec.type):
        keys: tuple[Any, ...] = tuple(map(pytree.SequenceKey, range(len(children))))
        with_keys = getattr(node, "flatten_with_keys_fn", None)
        with contextlib.suppress(Exception):  # names only: positions serve as well
            named = tuple(k for k, _ in with_keys(obj)[0]) if with_keys else ()
            if len(named) == len(children):
                keys = named
        out.append(keys)
    for child, sub in zip(children, spec_children(spec)):
        out += node_keys(child, sub)
    return out


def unflatten(spec: pytree.TreeSpec, leaves: Iterator[Any], keys: Iterator[tuple]) -> Any:
    """``tree_unflatten`` that runs no code of the model's classes: ``keys``
    gives, per container not :func:`plain` in pre-order, its children's keys
    (:func:`node_keys`; positions once it runs out)."""
    if spec.is_leaf():
        return next(leaves)
    own = None if plain(spec.type) else next(keys, None)
    children = [unflatten(child, leaves, keys) for child in spec_children(spec)]
    if spec.type is namedtuple:
        return tuple.__new__(spec.context, children)
    if plain(spec.type):
        return pytree.SUPPORTED_NODES[spec.type].unflatten_fn(children, spec.context)
    own = own or tuple(map(pytree.SequenceKey, range(len(children))))
    return ObjectOf(spec.type, own, tuple(children), spec.context)


def real_spec(spec: pytree.TreeSpec) -> pytree.TreeSpec:
    """``spec`` with each ``ObjectOf`` node turned into its class's own, so
    that it flattens and unflattens arguments of that class."""
    if spec.is_leaf():
        return spec
    children = [real_spec(child) for child in spec_children(spec)]
    if spec.type is ObjectOf:
        kind, _, context = spec.context
        return pytree.TreeSpec(kind, context, children)
    return pytree.TreeSpec(spec.type, spec.context, children)


def _flatten(o: ObjectOf) -> tuple[list[Any], Any]:
    return list(o.children), (o.type, o.keys, o.context)


def _unflatten(children: Any, context: Any) -> ObjectOf:
    kind, keys, own = context
    return ObjectOf(kind, keys, tuple(children), own)


# A container of descriptor trees like any other: normalize, concretize and the
# checks walk it with pytree; paths read with its children's own keys.
pytree.register_pytree_node(
    ObjectOf, _flatten, _unflatten,
    flatten_with_keys_fn=lambda o: (list(zip(o.keys, o.children)), _flatten(o)[1]))

