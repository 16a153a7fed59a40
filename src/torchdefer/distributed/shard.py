"""Replaying the deferred local tensors of shards: each rank pays for its shard.

A shard's local tensor is a deferred tensor whose recorded history is: build
the full parameter (its factory, its init ops), slice it (``chunk``,
``narrow``), and copy the slice into the shard's own storage. When the slice
is a contiguous range of the parameter's elements (``Shard(0)``: whole rows)
and every op of the parameter allows it, the replay computes only those
elements (``torchdefer.distributed._rows``): random ops draw just the shard's
numbers from generator states reached by jump-ahead, elementwise ops run on
the shard. A block of columns (``Shard(1)``: ``RowwiseParallel``, and FSDP2's
shard of it under TP+FSDP2) is computed the same way from chunks of whole rows
of the parameter, keeping its columns (``torchdefer.distributed._columns``).
Otherwise (``orthogonal_``, ``trunc_normal_``'s narrow uniform branch, a CUDA
generator) the slice of the graph is replayed as
recorded: the full parameter is built, sliced and freed when the replay ends.
Either way the values are bit for bit the eager parameter's slice, and a rank
holds its shards plus at most one full parameter at a time.

Each call here replays the targets of *one* parameter. Replaying the shards of
all parameters in one run would be wrong for memory: replay follows recording
order, in which every full parameter was built (during ``deferred_init``)
before any was sliced (during ``fully_shard``).

Setting the environment variable ``TORCHDEFER_SHARD_ROWS=0`` replays every
shard through its full parameter (slower, for comparison or diagnosis).
:func:`observe` reports which path each parameter took.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeGuard

import torch

from torchdefer.distributed._columns import ColumnRows
from torchdefer.materialize import Replay, ReplayError
from torchdefer.materialize._error_context import with_context
from torchdefer.recorder import DeferredTensor, Value, mark_materialized, target_of

__all__ = ["ShardReplay", "compact", "observe", "owns_only_itself", "replay_local",
           "same_recording"]


@dataclass(frozen=True, slots=True)
class ShardReplay:
    """How one parameter's local tensors were made (reported by :func:`observe`)."""

    name: str
    rows: bool  # no full parameter: from its own elements (or row chunks, see chunked)
    drawn: int  # elements its random ops drew on this rank
    numel: int  # elements of its local tensors (the largest, for FSDP2's padded shard)
    reason: str | None = None  # why not from its own elements (the op that stopped it)
    # A column block (Shard(1)): whole rows of the parameter, chunk by chunk
    # (distributed.columns), never the whole parameter at once.
    chunked: bool = False


_observers: contextvars.ContextVar[list[ShardReplay] | None] = contextvars.ContextVar(
    "torchdefer_shard_observers", default=None
)


@contextlib.contextmanager
def observe() -> Iterator[list[ShardReplay]]:
    """Collect a :class:`ShardReplay` for each parameter materialized inside the block.

    >>> import torch, torchdefer
    >>> from torchdefer.distributed.shard import observe, replay_local
    >>> full = torchdefer.deferred_init(torch.randn, 64, 4)
    >>> with observe() as seen:
    ...     _ = replay_local([full[16:32].clone()], "rows 16-31")
    >>> seen[0].rows, seen[0].drawn
    (True, 64)
    """
    seen: list[ShardReplay] = []
    token = _observers.set(seen)
    try:
        yield seen
    finally:
        _observers.reset(token)


def replay_local(fakes: list[DeferredTensor], name: str, *, mark: bool = True
                 ) -> list[torch.Tensor]:
    """Real tensors for ``fakes`` (all slices of one parameter ``name``), in one replay.

    Tensors that shared a storage when recorded share it once real (FSDP2's
    padded flat shard and the local tensor that views it).

    Args:
        fakes: deferred tensors of one graph.
        name: the parameter path, for error messages (``layers.0.attn.wq.weight``).

    Returns:
        One real tensor per fake, on the device the fake reports.
    """
    recorded = [target_of(f) for f in fakes]
    targets = [t.key for t in recorded]
    replay = Replay(recorded[0].graph, None)
    rows = ColumnRows(replay, targets) if os.environ.get("TORCHDEFER_SHARD_ROWS") != "0" else None
    try:
        reals = replay.run(targets, [name] * len(fakes), substitute=rows)
    except ReplayError as e:
        message = f"While materializing the local shard of '{name}'{_on_rank()}: {e}"
        raise with_context(e, message) from e
    if mark:  # later recorded writes to these storages would never reach the real ones
        mark_materialized(*recorded)
    seen = _observers.get()
    if seen is not None:
        seen.append(_report(name, [t.value for t in recorded], reals, rows))
    return [real.detach().requires_grad_(f.requires_grad) for f, real in zip(fakes, reals)]


def _report(name: str, values: list[Value], reals: list[torch.Tensor],
            rows: ColumnRows | None) -> ShardReplay:
    numel = max(r.numel() for r in reals)
    if rows is None:
        return ShardReplay(name, False, 0, numel, "TORCHDEFER_SHARD_ROWS=0")
    answered = all(rows.answered(v) for v in values)
    reasons = [rows.why_not(v) for v in values]
    reason = None if answered else next((r for r in reasons if r), "not asked")
    return ShardReplay(name, answered, rows.drawn, numel, reason, answered and rows.chunked)


def same_recording(a: object, b: DeferredTensor) -> TypeGuard[DeferredTensor]:
    """Whether ``a`` is a deferred tensor recorded into ``b``'s graph (FSDP2's padded
    flat shard and the local tensor that views it, replayed in one run)."""
    return isinstance(a, DeferredTensor) and target_of(a).graph is target_of(b).graph


def owns_only_itself(real: torch.Tensor) -> bool:
    """Whether ``real``'s storage holds just its own elements (nothing of a full tensor)."""
    return real.untyped_storage().nbytes() <= real.numel() * real.element_size()


def compact(real: torch.Tensor) -> torch.Tensor:
    """``real``, copied out of a larger storage (a full parameter) if it views one."""
    if owns_only_itself(real):
        return real
    return real.clone(memory_format=torch.contiguous_format)


def _on_rank() -> str:
    if torch.distributed.is_initialized():
        return f" on rank {torch.distributed.get_rank()}"
    return ""
