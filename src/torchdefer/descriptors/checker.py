"""``Checker``: validates one call's arguments against descriptor trees.

The checker walks the descriptors in argument order and binds each symbolic
name to the first length it meets, remembering where (``x.shape[1]``), so a
later conflict can name both places: ``'b' is 7 from x.shape[1]``.
``torch.export`` checks shapes on its own, but not dtype, device, rank,
requires_grad, values or structure, and its messages cannot point at the
first binding; hence this separate pass, run before every call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from torchdefer.descriptors.errors import DescriptorMismatch
from torchdefer.descriptors.meta_tensor_type import DimRange, MetaTensorType
from torchdefer.descriptors.tree import Node, TypeOf, Value

__all__ = ["Checker", "merge_ranges"]


class Checker:
    """One call's check: symbol bindings live here, so use one per call.

    Args:
        ranges: inclusive ``(min, max)`` bounds per symbolic name, as merged
            by :func:`merge_ranges` over all descriptors of the program.
    """

    def __init__(self, ranges: Mapping[str, DimRange]) -> None:
        self.ranges = ranges
        # name -> (length, path where it was first seen)
        self.bound: dict[str, tuple[int, str]] = {}

    def check(self, node: Node, value: Any, path: str) -> None:
        """Check ``value`` (the argument at ``path``) against ``node``."""
        if isinstance(node, MetaTensorType):
            self.check_tensor(node, value, path)
        elif isinstance(node, Value):
            _check_value(node, value, path)
        elif isinstance(node, TypeOf):
            if not node.admits(value):
                raise DescriptorMismatch(path, "type", node.type.__name__, _describe(value))
        elif isinstance(node, dict):
            self._check_dict(node, value, path)
        else:
            self._check_sequence(node, value, path)

    def check_tensor(self, desc: MetaTensorType, t: Any, path: str) -> None:
        """Check one tensor against one descriptor, binding its symbols."""
        if not isinstance(t, torch.Tensor):
            raise DescriptorMismatch(path, "type", "a Tensor", _describe(t))
        if desc.rank is not None and t.dim() != desc.rank:
            raise DescriptorMismatch(
                path, "ndim", str(desc.rank), f"{t.dim()} (shape {list(t.shape)})"
            )
        for prop in ("dtype", "layout", "requires_grad"):
            want = getattr(desc, prop)
            if want is not None and getattr(t, prop) != want:
                raise DescriptorMismatch(path, prop, str(want), str(getattr(t, prop)))
        if desc.device is not None and not _device_admits(desc.device, t.device):
            raise DescriptorMismatch(path, "device", repr(str(desc.device)), repr(str(t.device)))
        for i, (want, size) in enumerate(zip(desc.shape or (), t.shape, strict=False)):
            self._check_dim(want, size, path, i)

    def _check_dim(self, want: int | str | None, size: int, path: str, i: int) -> None:
        where = f"{path}.shape[{i}]"
        if want is None:
            return
        if isinstance(want, int):
            if size != want:
                raise DescriptorMismatch(path, f"shape[{i}]", str(want), str(size))
            return
        lo, hi = self.ranges.get(want, (0, None))
        if size < lo or (hi is not None and size > hi):
            raise DescriptorMismatch(
                path,
                f"shape[{i}]",
                f"{want!r} in [{lo}, {'inf' if hi is None else hi}]",
                str(size),
                f"{want!r} is outside its range",
            )
        bound = self.bound.setdefault(want, (size, where))
        if bound[0] != size:
            raise DescriptorMismatch(
                path,
                f"shape[{i}]",
                f"{want!r} = {bound[0]}",
                str(size),
                f"{want!r} is {bound[0]} from {bound[1]}",
            )

    def _check_sequence(self, node: tuple | list, value: Any, path: str) -> None:
        kind = type(node).__name__
        if type(value) is not type(node):
            raise DescriptorMismatch(
                path, "structure", f"a {kind} of length {len(node)}", _describe(value)
            )
        if len(value) != len(node):
            raise DescriptorMismatch(
                path,
                "structure",
                f"a {kind} of length {len(node)}",
                f"a {kind} of length {len(value)}",
            )
        for i, (child, item) in enumerate(zip(node, value, strict=True)):
            self.check(child, item, f"{path}[{i}]")

    def _check_dict(self, node: dict, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise DescriptorMismatch(
                path, "structure", f"a dict with keys {list(node)}", _describe(value)
            )
        if set(value) != set(node):
            missing = [k for k in node if k not in value]
            extra = [k for k in value if k not in node]
            raise DescriptorMismatch(
                path,
                "structure",
                f"a dict with keys {list(node)}",
                f"keys {list(value)}",
                f"missing {missing}, unexpected {extra}",
            )
        for key, child in node.items():
            self.check(child, value[key], f"{path}[{key!r}]")


def merge_ranges(descs: list[MetaTensorType]) -> dict[str, DimRange]:
    """Intersect the ranges that several descriptors give one name.

    Raises:
        ValueError: when the intersection is empty.
    """
    merged: dict[str, DimRange] = {}
    for desc in descs:
        for name, (lo, hi) in desc.ranges.items():
            old_lo, old_hi = merged.get(name, (0, None))
            new_hi = hi if old_hi is None else (old_hi if hi is None else min(hi, old_hi))
            new_lo = max(lo, old_lo)
            if new_hi is not None and new_lo > new_hi:
                raise ValueError(
                    f"dim_ranges for {name!r} do not overlap: ({old_lo}, {old_hi}) and "
                    f"({lo}, {hi}); give one range per name"
                )
            merged[name] = (new_lo, new_hi)
    return merged


def _check_value(node: Value, value: Any, path: str) -> None:
    want = node.value
    same = type(value) is type(want) and (value == want or _both_nan(value, want))
    if not same:
        raise DescriptorMismatch(
            path,
            "value",
            repr(want),
            repr(value) if _is_scalar(value) else _describe(value),
            "the program was specialized for this value; script another program for "
            f"{repr(value) if _is_scalar(value) else 'it'} or describe the argument by its type",
        )


def _both_nan(a: Any, b: Any) -> bool:
    return isinstance(a, float) and isinstance(b, float) and a != a and b != b


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (type(None), bool, int, float, str, torch.dtype, torch.device))


def _device_admits(want: torch.device, got: torch.device) -> bool:
    if want.index is None:
        return want.type == got.type
    return want == got


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a Tensor of shape {list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of length {len(value)}"
    if _is_scalar(value):
        return f"{type(value).__name__} {value!r}"
    return f"a {type(value).__name__}"
