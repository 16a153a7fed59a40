"""Replaying the deferred local tensors of shards, one full parameter at a time.

A shard's local tensor is a deferred tensor whose recorded history is: build
the full parameter (its factory, its init ops), slice it (``chunk``,
``narrow``), and copy the slice into the shard's own storage. Replaying that
slice of the graph allocates the full parameter, runs its init, keeps the
slice and frees the full tensor when the replay ends, so a rank holds its
shards plus one full parameter at a time: never the whole model.

Each call here replays the targets of *one* parameter. Replaying the shards of
all parameters in one run would be wrong for memory: replay follows recording
order, in which every full parameter was built (during ``deferred_init``)
before any was sliced (during ``fully_shard``).
"""

from __future__ import annotations

import torch

from torchdefer.materialize import Replay, ReplayError
from torchdefer.materialize.errors import with_context
from torchdefer.recorder import DeferredTensor

__all__ = ["compact", "owns_only_itself", "replay_local"]


def replay_local(fakes: list[DeferredTensor], name: str) -> list[torch.Tensor]:
    """Real tensors for ``fakes`` (all slices of one parameter ``name``), in one replay.

    Tensors that shared a storage when recorded share it once real (FSDP2's
    padded flat shard and the local tensor that views it).

    Args:
        fakes: deferred tensors of one graph.
        name: the parameter path, for error messages (``layers.0.attn.wq.weight``).

    Returns:
        One real tensor per fake, on the device the fake reports.
    """
    graph = fakes[0]._graph
    targets = [(f._value, f._value.storage.version) for f in fakes]
    try:
        reals = Replay(graph, None).run(targets, [name] * len(fakes))
    except ReplayError as e:
        message = f"While materializing the local shard of '{name}'{_on_rank()}: {e}"
        raise with_context(e, message) from e
    for fake in fakes:
        # Later recorded writes to this storage would never reach the real one.
        fake._value.storage.materialized = True
    return [real.detach().requires_grad_(f.requires_grad) for f, real in zip(fakes, reals)]


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
