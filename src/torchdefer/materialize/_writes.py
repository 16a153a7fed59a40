"""Replaying an op while watching for writes it did not declare.

The recorder knows what an op writes from its schema (``Tensor(a!)``) and from
``recorder._alias.UNANNOTATED_WRITES``. An op that writes anything else (a
custom op registered with too few ``mutates_args``) changed a tensor the graph
believes untouched: values materialized from it could differ from eager. Real
in-place writes through PyTorch bump the tensor's version counter, so replay
compares versions around the call and refuses such a write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdefer.errors import ReplayError
from torchdefer.recorder._graph import Node, Value

__all__ = ["call_watching_writes"]


def call_watching_writes(node: Node, leaves: list[Any], call: Callable[[], Any]) -> Any:
    """Run ``call()`` (``node`` on ``leaves``); raise if it bumped an input it does not write."""
    written = {id(storage) for storage, _ in node.writes}
    # Inference tensors (replayed from a recording under inference_mode) keep
    # no version counter to watch.
    watched = [
        (i, real, real._version)
        for i, (leaf, real) in enumerate(zip(node.leaves, leaves))
        if isinstance(leaf, Value) and id(leaf.storage) not in written
        and not real.is_inference()
    ]
    out = call()
    # A tensor that shares its storage with a written one after the call may
    # share its version counter too (a view; `set_` onto its storage): the
    # written tensor's bump shows on it, which is not a write of its own.
    shared = {
        _storage_ptr(real)
        for leaf, real in zip(node.leaves, leaves)
        if isinstance(leaf, Value) and id(leaf.storage) in written
    }
    for i, real, version in watched:
        if real._version != version and _storage_ptr(real) not in shared:
            name = _argument_name(node, i)
            raise ReplayError(
                f"{node.name} recorded at {node.where()} wrote to its argument {name}, "
                "which its schema does not mark as written, so deferred_init recorded "
                "it as a read and values that depend on it would differ from eager. "
                "Declare the write (torch.library.custom_op(..., mutates_args=[...]) "
                "or `Tensor(a!)` in the schema), or run the op after materialization."
            )
    return out


def _argument_name(node: Node, position: int) -> str:
    """The schema name of the argument at flat ``position`` (see recorder._args)."""
    schema = getattr(node.op, "_schema", None)
    if schema is None or node.spec is None:
        return f"#{position}"
    n_args, keys, shape = node.spec
    start = 0
    for k, s in enumerate(shape):
        width = 1 if s is None else s[1]
        if start <= position < start + width:
            if k >= n_args:
                return f"'{keys[k - n_args]}'"
            if k < len(schema.arguments):
                return f"'{schema.arguments[k].name}'"
        start += width
    return f"#{position}"


def _storage_ptr(t: Any) -> int | None:
    try:
        return t.untyped_storage().data_ptr() or None
    except (RuntimeError, AttributeError):  # no storage of its own (a subclass)
        return None
