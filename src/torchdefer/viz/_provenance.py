"""explain: the recorded ops that produce a tensor's value, in words."""

from __future__ import annotations

import torch
from torch import nn

from torchdefer.errors import UsageTypeError
from torchdefer.materialize._plan import recorded_slice
from torchdefer.recorder._graph import Node, NodeKind, Value
from torchdefer.recorder._target import target_of
from torchdefer.recorder._tensor import DeferredTensor, holds_deferred
from torchdefer.viz._format import (
    fmt_dtype,
    fmt_meta,
    fmt_shape,
    fmt_source,
    node_title,
    rng_text,
)
from torchdefer.viz._target import describe_real, module_paths, owner_names

__all__ = ["explain"]


def explain(tensor: torch.Tensor, root: nn.Module | None = None) -> str:
    """Say how a deferred tensor's value is made: the recorded ops replay would run.

    One line per op, in replay (recording) order: its number, kind, call with
    non-default arguments (``%N`` is the output of op ``#N``), output shape,
    dtype and device, the storage it lives in and the version it writes, the
    generator draw of random ops, and the user's ``file:line``. Writes made
    through other views after the tensor was taken are marked. The last line
    is the tensor's module path (``model.layers.3.mlp.down_proj.weight``).

    Args:
        tensor: a deferred tensor (a real one is reported as such).
        root: the model holding it, to name it; without it the live modules
            of the process are searched (slower on huge heaps).

    Returns:
        The explanation, several lines of text.

    >>> import torch, torchdefer
    >>> m = torchdefer.deferred_init(torch.nn.Linear, 4, 2)
    >>> print(torchdefer.explain(m.weight, m).splitlines()[-1])
    module path: weight
    """
    if not isinstance(tensor, torch.Tensor):
        raise UsageTypeError(
            f"explain expects a tensor, got {type(tensor).__name__}; for a parameter by name "
            "use explain(model.get_parameter(name), model)."
        )
    names = module_paths(root, tensor) if root is not None else owner_names(tensor)
    path_line = "module path: " + (
        ", ".join(names) if names else "none (not a parameter or buffer of a live module)"
    )
    title = names[0] if names else "tensor"
    what = "Parameter" if isinstance(tensor, nn.Parameter) else "tensor"
    wrapper = ""
    if not isinstance(tensor, DeferredTensor) and holds_deferred(tensor):
        # A DTensor / FSDP2 parameter around a deferred local shard: is_deferred
        # says True for it, so explain the shard that replay would make.
        wrapper = f" (the local shard of a {type(tensor).__name__})"
        tensor = _inner_deferred(tensor)
    if not isinstance(tensor, DeferredTensor):
        return "\n".join([
            f"{title}: a real {what} ({describe_real(tensor)}), not deferred. Nothing was "
            "recorded for it: it was never built by torchdefer.deferred_init, or it was "
            "already materialized.",
            path_line,
        ])
    target = target_of(tensor)
    value, storage = target.value, target.storage
    nodes = recorded_slice([target.key])
    lines = [
        f"{title}{wrapper}: deferred {what} {_shape_on(value)}, storage s#{storage.id} at "
        f"version {storage.version}"
        + (" (already materialized once)" if target.materialized else ""),
        f"replay runs {len(nodes)} recorded op{'s' if len(nodes) != 1 else ''}, in this order:",
    ]
    width = len(str(nodes[-1].seq)) + 1 if nodes else 2
    lines += [_op_line(node, value, width) for node in nodes]
    lines.append(path_line)
    return "\n".join(lines)


def _inner_deferred(tensor: torch.Tensor) -> torch.Tensor:
    """The first deferred tensor inside a wrapper subclass (DTensor's local tensor)."""
    names, _ = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
    for name in names:
        inner = getattr(tensor, name)
        if holds_deferred(inner):
            return inner if isinstance(inner, DeferredTensor) else _inner_deferred(inner)
    return tensor


def _shape_on(value: Value) -> str:
    meta = value.meta
    return f"{fmt_shape(meta.size)} {fmt_dtype(meta.dtype)} on {meta.device}"


def _op_line(node: Node, target: Value, width: int) -> str:
    parts = [f"  {'#' + str(node.seq):<{width}} {node.kind:<8} {node_title(node)}"]
    if node.outputs:
        out = node.outputs[0]
        parts.append(f"-> {fmt_meta(out.meta)} s#{out.storage.id}")
    for storage, version in node.writes:
        parts.append(f"writes s#{storage.id} v{version}")
    rng = rng_text(node)
    if rng is not None:
        parts.append(rng)
    note = _mutation_note(node, target)
    if note:
        parts.append(note)
    source = fmt_source(node.source)
    parts.append(f"at {source}" if source else "at <unknown location>")
    return "  ".join(parts)


def _mutation_note(node: Node, target: Value) -> str | None:
    """Say so when an op changes the tensor's storage through another tensor."""
    if node.kind not in (NodeKind.INPLACE, NodeKind.RANDOM) or node is target.node:
        return None
    for storage, _ in node.writes:
        if storage is not target.storage:
            continue
        through = [v for v in node.inputs if v.storage is storage]
        if node.seq > target.node.seq and through and through[0].node is not target.node:
            return (f"[mutates this tensor's storage through %{through[0].node.seq}, "
                    f"after this tensor was taken by #{target.node.seq}]")
    return None
