"""``Checker``: binds each call to parameters and checks every argument.

Binding is Python's own (``inspect.Signature.bind``, with an all-positional
fast path). The descriptors are compiled once into small checks that walk the
argument in pytree order, binding each symbolic name to the first length it
meets and remembering where, so a later conflict names both places (``'b' is
7 from x.shape[1]``): ``torch.export`` checks shapes, but not dtype, device,
rank, ``requires_grad``, values or structure, and cannot point at the first
binding. With ``specialize=True`` (export: one graph per concrete case) a
check also binds ``None`` dims and ``int`` arguments and returns the call's
*facts* -- what the descriptors leave open (a dtype, a list's length, whether
an ``Optional`` is ``None``) -- which :func:`concretize` reads back in order.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch.utils._pytree as pytree

from torchdefer.descriptors._call import call_error
from torchdefer.descriptors._meta_tensor_type import (
    SCALARS,
    DimRange,
    MetaTensorType,
    TensorCheck,
    describe_value,
)
from torchdefer.descriptors._object_of import ObjectOf
from torchdefer.descriptors._tree import ListOf, Node, OptionalOf, Param, TypeOf, Value
from torchdefer.errors import DescriptorMismatch, UsageError, UsageTypeError

__all__ = ["NOT_ACCEPTED", "Checker", "Key", "concrete_trees", "concretize", "merge_ranges",
           "show_key"]

Key = Any
"""A size as the checker binds it in ``env``: a symbolic name (``"b"``), a
``None`` dim (``("x", 1)``) or an ``int`` argument (``("n",)``)."""

NOT_ACCEPTED = object()
"""Stands for a parameter whose default is not a plain value (a tensor): the
program uses the default and refuses a passed value."""

Check = Callable[[Any, str, dict, dict, "list | None"], None]


class Checker:
    """Binds and checks calls for one program (``specialize``: see the module).

    Calling it returns ``(values, env, facts)``: every parameter's value in
    order (defaults applied, ``NOT_ACCEPTED`` where the default stands), the
    bound symbols, and the facts as a tuple.
    """

    def __init__(self, qualname: str, params: tuple[Param, ...], ranges: Mapping[str, DimRange],
                 specialize: bool, method: bool = False, variadic: bool = False) -> None:
        self.qualname, self.params, self.specialize = qualname, params, specialize
        self.method = method  # a bound method: Python's messages count its self
        self.variadic = variadic  # the callable takes *args/**kwargs, which the program does not
        self.ranges = dict(ranges)
        self.signature = inspect.Signature([
            inspect.Parameter(p.name, getattr(inspect.Parameter, p.kind),
                              default=NOT_ACCEPTED if p.node is None else p.default)
            for p in params])
        self.checks = [None if p.node is None else self.compile(p.node) for p in params]
        # All-positional calls with every parameter given skip inspect's binding (~4 us).
        self.fast = len(params) if all(p.kind != "KEYWORD_ONLY" and p.node is not None
                                       for p in params) else -1

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict, tuple]:
        if kwargs or len(args) != self.fast:
            args = self.bind(args, kwargs)
        env: dict = {}
        where: dict = {}  # name -> (path, dim) of its first binding, for messages
        facts: list | None = [] if self.specialize else None
        for param, check, value in zip(self.params, self.checks, args):
            if check is not None:
                check(value, param.name, env, where, facts)
        return args, env, () if facts is None else tuple(facts)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            message = call_error(self.qualname, self.signature, args, kwargs, self.method)
            if message and self.variadic and ("were given" in message or "was given" in message
                                              or "unexpected keyword" in message):
                message += (" (the program takes no *args or **kwargs, which descriptors cannot "
                            "describe; its parameters are the named ones)")
            raise UsageTypeError(message or f"{self.qualname}(): {e}") from None
        passed = [n for n, v in bound.arguments.items() if v is not NOT_ACCEPTED
                  and self.signature.parameters[n].default is NOT_ACCEPTED]
        if passed:
            raise UsageTypeError(
                f"{self.qualname}() program does not accept {passed}: their defaults are not "
                "plain values, so the program was built with the defaults; describe them in "
                "input_descriptors to pass them")
        bound.apply_defaults()
        return tuple(bound.arguments.values())

    # --------------------------------------------------------------- compile
    def compile(self, node: Node) -> Check:
        """A check for one descriptor tree; paths are passed at call time."""
        if isinstance(node, MetaTensorType):
            return TensorCheck(node, self.ranges, self.specialize)
        if isinstance(node, Value):
            return _check_value(node.value)
        if isinstance(node, TypeOf):
            return _check_type(node.type, exact=not self.specialize)
        if isinstance(node, ListOf):
            return _check_list(self.compile(node.element))
        if isinstance(node, OptionalOf):
            return _check_optional(self.compile(node.inner))
        return self._check_container(node)

    def _check_container(self, node: Node) -> Check:
        """One level of a tuple / list / dict / pytree-registered container."""
        level = pytree.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[0]
        # An ObjectOf stands for an argument of its class, flattened by its class.
        kind: type[Any] = node.type if isinstance(node, ObjectOf) else type(node)
        n = len(level)
        # A dict's key paths are MappingKeys (KeyEntry, the protocol, has no key).
        keys = [kp[0].key for kp, _ in level] if kind is dict else None  # type: ignore[attr-defined]
        checks = [(pytree.keystr(kp), self.compile(child)) for kp, child in level]
        flatten = pytree.SUPPORTED_NODES[kind].flatten_fn
        context = node.context if isinstance(node, ObjectOf) else flatten(node)[1]
        want = (f"a dict with keys {keys}" if keys is not None
                else f"a {kind.__name__} of length {n}")

        def check_container(value: Any, path: str, env: dict, where: dict,
                            facts: list | None) -> None:
            if not (type(value) is kind or (keys is not None and isinstance(value, dict))):
                raise DescriptorMismatch(path, "structure", want, describe_value(value))
            if keys is not None:
                if value.keys() != set(keys):
                    missing = [k for k in keys if k not in value]
                    extra = [k for k in value if k not in keys]
                    raise DescriptorMismatch(path, "structure", want, f"keys {list(value)}",
                                             f"missing {missing}, unexpected {extra}")
                items = [value[k] for k in keys]
            else:
                items, got = flatten(value)
                if len(items) != n or got != context:
                    raise DescriptorMismatch(path, "structure", want, describe_value(value))
            for (suffix, check), item in zip(checks, items):
                check(item, path + suffix, env, where, facts)

        return check_container


def _check_list(element: Check) -> Check:
    def check_list(value: Any, path: str, env: dict, where: dict, facts: list | None) -> None:
        if type(value) is not list:
            raise DescriptorMismatch(path, "type", "a list", describe_value(value))
        if facts is not None:
            facts.append(len(value))
        for i, item in enumerate(value):
            element(item, f"{path}[{i}]", env, where, facts)

    return check_list


def _check_optional(inner: Check) -> Check:
    def check_optional(value: Any, path: str, env: dict, where: dict, facts: list | None) -> None:
        if facts is not None:
            facts.append(value is None)
        if value is not None:
            inner(value, path, env, where, facts)

    return check_optional


def _check_value(want: Any) -> Check:
    def check_value(value: Any, path: str, env: dict, where: dict, facts: list | None) -> None:
        if type(value) is type(want) and (value == want or (value != value and want != want)):
            return
        shown = repr(value) if isinstance(value, SCALARS) else describe_value(value)
        raise DescriptorMismatch(
            path, "value", repr(want), shown,
            "the program was specialized for this value; script another program for "
            f"{shown if isinstance(value, SCALARS) else 'it'} or describe the argument by its type",
        )

    return check_value


def _check_type(kind: type, exact: bool = False) -> Check:
    """``exact`` (TorchScript): no int for a float, which TorchScript would turn
    into a float where eager code keeps the int (``torch.full((2,), 3)`` is int64)."""
    allowed = (int, float) if kind is float and not exact else (kind,)

    def check_type(value: Any, path: str, env: dict, where: dict, facts: list | None) -> None:
        if not isinstance(value, allowed) or (isinstance(value, bool) and kind is not bool):
            detail = ("TorchScript would run it as a float, where the eager model keeps an int; "
                      f"pass {value}.0") if kind is float and type(value) is int else ""
            raise DescriptorMismatch(path, "type", kind.__name__, describe_value(value), detail)
        if facts is None:
            return
        if kind is int:
            env[(path,)] = value  # a symbol of the program: its coverage is checked
        else:
            facts.append(value)  # export bakes floats, bools and strings in

    return check_type


def merge_ranges(descs: list[MetaTensorType]) -> dict[str, DimRange]:
    """Intersect the ranges that several descriptors give one name; raises
    ``ValueError`` when the intersection is empty."""
    merged: dict[str, DimRange] = {}
    for desc in descs:
        for name, (lo, hi) in desc.ranges.items():
            old_lo, old_hi = merged.get(name, (0, None))
            new_lo, new_hi = max(lo, old_lo), min((h for h in (hi, old_hi) if h is not None),
                                                  default=None)
            if new_hi is not None and new_lo > new_hi:
                raise UsageError(
                    f"dim_ranges for {name!r} do not overlap: ({old_lo}, {old_hi}) and "
                    f"({lo}, {hi}); give one range per name")
            merged[name] = (new_lo, new_hi)
    return merged


def concretize(node: Node, path: str, fact: Callable[[str], Any], fixed: Mapping[Any, int]) -> Node:
    """The tree one variant is built for: only ``MetaTensorType`` (rank, dtype,
    device, layout known), ``Value`` and ``TypeOf(int)`` leaves.

    ``fact(kind)`` gives the next open property (``dtype``, ``device``,
    ``layout``, ``rank``, ``len``, ``none``, ``value``) in the order the
    :class:`Checker` records them, and may raise to give up; ``fixed`` holds
    the sizes this variant fixes (0/1, values a guard needs) by checker key.
    """
    if isinstance(node, MetaTensorType):
        dtype, device, layout, rank = (fact(k) if getattr(node, k) is None else getattr(node, k)
                                       for k in ("dtype", "device", "layout", "rank"))
        shape = [d if isinstance(d, int) else fixed.get(d if isinstance(d, str) else (path, i), d)
                 for i, d in enumerate(node.shape if node.shape is not None else (None,) * rank)]
        return replace(node, shape=tuple(shape), rank=rank, dtype=dtype, device=device,
                       layout=layout, dim_ranges=tuple(r for r in node.dim_ranges if r[0] in shape))
    if isinstance(node, TypeOf):
        if node.type is not int:
            return Value(fact("value"))
        return Value(fixed[(path,)]) if (path,) in fixed else node
    if isinstance(node, ListOf):
        return [concretize(node.element, f"{path}[{i}]", fact, fixed) for i in range(fact("len"))]
    if isinstance(node, OptionalOf):
        return Value(None) if fact("none") else concretize(node.inner, path, fact, fixed)
    if isinstance(node, Value):
        return node
    with_paths, spec = pytree.tree_flatten_with_path(node)
    return pytree.tree_unflatten(
        [concretize(leaf, path + pytree.keystr(kp), fact, fixed) for kp, leaf in with_paths], spec)


def concrete_trees(params: tuple[Param, ...], facts: tuple, fixed: Mapping[Key, int]) -> dict:
    """The concrete tree of every accepted parameter for one case (facts as the
    checker recorded them)."""
    stream = iter(facts)
    return {p.name: concretize(p.node, p.name, lambda kind: next(stream), fixed)
            for p in params if p.node is not None}


def show_key(key: Key) -> str:
    """How messages write a key: ``b``, ``x.shape[1]``, ``n``."""
    if isinstance(key, str):
        return key
    return f"{key[0]}.shape[{key[1]}]" if len(key) == 2 else key[0]

