"""Collectives on deferred tensors: calls whose effect lands outside the recording.

A *collective* (``torch.distributed.broadcast``, ``scatter``, the functional
collectives of DTensor and FSDP) cannot be deferred: its result comes from
other ranks' data, which no rank has while the tensors are deferred. Refused,
with the fix (``distribute_tensor(..., src_data_rank=None)`` when every rank
builds the same model from the same seed, or materialize first).

The other such call, an in-place write into a *real* tensor outside
``deferred_init``, is answered by ``recorder._tensor`` (``write_real``).
"""

from __future__ import annotations

from typing import Any

from torchdefer import _compat
from torchdefer.errors import RecordingError
from torchdefer.fake._source import user_frame

__all__ = ["collective_name", "refuse_collective"]

# Namespaces of the collective ops (c10d: process-group ops; the functional
# ones are what DTensor redistribution and FSDP2 all-gathers dispatch).
_COLLECTIVE_NAMESPACES = frozenset(
    {"c10d", "_c10d_functional", "_c10d_functional_autograd", "c10d_functional", "_dtensor"}
)


def refuse_collective(func: Any) -> None:
    """Raise if ``func`` is a collective (a ``torch.distributed`` call or a c10d op)."""
    if type(func) is _OP_OVERLOAD:  # by id: OpOverload.__hash__ is Python code
        entry = _ops.get(id(func))
        if entry is None:
            entry = _ops[id(func)] = (func, collective_name(func))
        known: str | None = entry[1]
    else:
        known = _collectives.get(func)
        if known is None:
            known = _collectives[func] = collective_name(func)
    if known:
        raise _collective_error(known)


# func -> its name if it is a collective, else "" (this runs on every op).
_collectives: dict[Any, str] = {}
# The same for aten-level ops, by id; the op is kept, so its id stays its own.
_ops: dict[int, tuple[Any, str]] = {}
_OP_OVERLOAD = _compat.OpOverload


def collective_name(func: Any) -> str:
    """``func``'s name if it is a collective, else ``""``."""
    namespace = getattr(func, "namespace", None)
    if namespace is not None:  # an aten-level op
        return str(func) if namespace in _COLLECTIVE_NAMESPACES else ""
    module = getattr(func, "__module__", None) or ""
    if not module.startswith("torch.distributed"):
        return ""
    return f"{module}.{getattr(func, '__name__', func)}"


def _collective_error(name: str) -> RecordingError:
    frame = user_frame(3)
    where = "<unknown location>" if frame is None else str(frame)
    return RecordingError(
        f"{name} was called on a deferred tensor (at {where}). A collective needs the "
        "tensor's data, which no rank has until it is materialized, so its result cannot "
        "be recorded. If it comes from distribute_tensor or parallelize_module: pass "
        "src_data_rank=None (every rank built the same model from the same seed, so each "
        "rank's own slice is bit for bit what rank 0 would send), then "
        "torchdefer.distributed.materialize_module(model); for DTensor.from_local pass "
        "run_check=False. Otherwise materialize first (torchdefer.materialize_module) and "
        "run the collective on real tensors."
    )
