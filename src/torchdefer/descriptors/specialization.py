"""``Specialization``: a callable's parameters and the descriptor of each.

This is the backend-independent half of a program: how a call binds to
parameters, which argument leaves are inputs to the specialized graph and
which are baked in, and the check that every call passes first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from torchdefer.descriptors.checker import Checker, merge_ranges
from torchdefer.descriptors.meta_tensor_type import DimRange, MetaTensorType
from torchdefer.descriptors.signature import Signature
from torchdefer.descriptors.tree import Node, Value, leaves, normalize
from torchdefer.descriptors.tree import from_json as tree_from_json
from torchdefer.descriptors.tree import to_json as tree_to_json

__all__ = ["Specialization"]


@dataclass(frozen=True, slots=True)
class Specialization:
    """Descriptor trees for every accepted parameter of one callable.

    Args:
        signature: the callable's parameters.
        trees: descriptor tree per parameter; parameters the user did not
            describe appear as :class:`Value` of their default.
        described: the parameters the user described, in signature order.
        ranges: merged ``(min, max)`` bounds per symbolic name.
    """

    signature: Signature
    trees: dict[str, Node]
    described: tuple[str, ...]
    ranges: dict[str, DimRange]

    @classmethod
    def build(cls, fn: Callable[..., Any], descriptors: Mapping[str, Any]) -> Specialization:
        """Read ``fn``'s signature and normalize the user's descriptors for it.

        Raises:
            TypeError: a descriptor names no parameter, or a parameter has
                neither descriptor nor default.
        """
        if not isinstance(descriptors, Mapping):
            raise TypeError(
                "input_descriptors must be a dict from parameter name to descriptor, got "
                f"{type(descriptors).__name__}"
            )
        signature, defaults = Signature.of(fn)
        names = [p.name for p in signature.parameters]
        unknown = [k for k in descriptors if k not in names]
        if unknown:
            raise TypeError(
                f"input_descriptors names {unknown} but {signature.qualname}() has parameters "
                f"{names} (*args/**kwargs cannot be described)"
            )
        trees: dict[str, Node] = {}
        for name in names:
            if name in descriptors:
                trees[name] = normalize(descriptors[name], name)
            elif name in defaults and _is_plain(defaults[name]):
                trees[name] = normalize(defaults[name], name)
            elif name in defaults:
                continue  # a non-plain default (a tensor, an object): not accepted
            else:
                raise TypeError(
                    f"parameter {name!r} of {signature.qualname}() has no default and no input "
                    f"descriptor; add input_descriptors[{name!r}]"
                )
        tensors = [
            leaf
            for tree in trees.values()
            for _, leaf in leaves(tree, "")
            if isinstance(leaf, MetaTensorType)
        ]
        described = tuple(n for n in names if n in descriptors)
        return cls(signature, trees, described, merge_ranges(tensors))

    # ----------------------------------------------------------------- calls
    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Bind and check one call; returns every accepted parameter's value.

        Raises:
            DescriptorMismatch: an argument violates its descriptor.
            TypeError: the call does not bind (missing/unknown arguments).
        """
        bound = self.signature.bind(args, kwargs)
        extra = [k for k in bound if k not in self.trees]
        if extra:
            raise TypeError(
                f"{self.signature.qualname}() program does not accept {extra}: their defaults "
                "are not plain values, so they were left out of the specialization"
            )
        checker = Checker(self.ranges)
        full = {}
        for name, tree in self.trees.items():
            if name in bound:
                checker.check(tree, bound[name], name)
                full[name] = bound[name]
            elif isinstance(tree, Value):
                full[name] = tree.value
            else:
                raise TypeError(
                    f"{self.signature.qualname}() program is missing argument {name!r}, "
                    f"described as {tree!r}"
                )
        return full

    def dynamic_leaves(self) -> Iterator[tuple[str, Any]]:
        """``(path, leaf)`` of every leaf that is a graph input (not a value)."""
        for name, tree in self.trees.items():
            for path, leaf in leaves(tree, name):
                if not isinstance(leaf, Value):
                    yield path, leaf

    def flatten(self, full: Mapping[str, Any]) -> list[Any]:
        """The graph inputs of a checked call, in :meth:`dynamic_leaves` order."""
        out: list[Any] = []
        for name, tree in self.trees.items():
            _collect(tree, full[name], out)
        return out

    @property
    def user_descriptors(self) -> dict[str, Node]:
        """The descriptors the user gave, normalized."""
        return {name: self.trees[name] for name in self.described}

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        return {
            "signature": self.signature.to_json(),
            "trees": [[name, tree_to_json(tree)] for name, tree in self.trees.items()],
            "described": list(self.described),
            "ranges": [[name, lo, hi] for name, (lo, hi) in self.ranges.items()],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Specialization:
        return cls(
            Signature.from_json(data["signature"]),
            {name: tree_from_json(tree) for name, tree in data["trees"]},
            tuple(data["described"]),
            {name: (lo, hi) for name, lo, hi in data["ranges"]},
        )


def _collect(tree: Node, value: Any, out: list[Any]) -> None:
    if isinstance(tree, (tuple, list)):
        for child, item in zip(tree, value, strict=True):
            _collect(child, item, out)
    elif isinstance(tree, dict):
        for key, child in tree.items():
            _collect(child, value[key], out)
    elif not isinstance(tree, Value):
        out.append(value)


def _is_plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_is_plain(v) for v in value.values())
    return isinstance(value, (type(None), bool, int, float, str, torch.dtype, torch.device))
