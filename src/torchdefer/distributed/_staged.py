"""A sharded load's changes, staged in an :class:`~torchdefer.checkpoint._install.Installation`,
and the vote that makes every rank commit them or none.

A shard is installed by pointing the DTensor (and FSDP2's flat shard) at a
real tensor: an attribute change, staged with what undoes it exactly. Shards
the checkpoint lacks are replayed here before anything changes (as
:func:`torchdefer.distributed.materialize_module` would make them), so a
replay that fails leaves the module as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from torchdefer.checkpoint._install import Installation
from torchdefer.distributed._module import _dtensors, _fsdp2_params, _parameter_names
from torchdefer.distributed.shard import compact, replay_local, same_recording
from torchdefer.errors import CheckpointError, CheckpointRankError
from torchdefer.recorder import DeferredTensor, mark_materialized, target_of

__all__ = ["Vote", "stage_missing_shards", "stage_shard"]


class Vote:
    """Each rank says whether its part of a load holds; all learn whether every part does.

    Called on every rank at the same point, with ``None`` or this rank's
    error (one ``all_gather_object`` over the default group), it raises
    :class:`~torchdefer.checkpoint.CheckpointRankError` on every rank when any
    rank failed, quoting the failing ranks' errors. A rank that fails between
    votes calls :meth:`refuse`, which votes once, at the vote the others are
    waiting in.
    """

    def __init__(self, where: str) -> None:
        self.where = where  # the checkpoint, for the message
        self._settled = False  # a vote that saw a failure was taken: no more votes

    def __call__(self, error: BaseException | None = None) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            return
        said: list[str | None] = [None] * dist.get_world_size()
        mine = None if error is None else f"{type(error).__name__}: {error}"
        dist.all_gather_object(said, mine)  # strings of our own ranks, not of the file
        failed = {rank: text for rank, text in enumerate(said) if text is not None}
        if failed:
            self._settled = True
            ranks = ", ".join(map(str, failed))
            first = next(iter(failed.values()))
            raise CheckpointRankError(
                f"Loading {self.where} failed on rank{'s' if len(failed) > 1 else ''} {ranks} "
                f"({first}), so rank {dist.get_rank()} refused it too: every rank's module is "
                "as it was before the load. Fix what that error names and load again."
            )

    def refuse(self, error: BaseException) -> None:
        """Vote ``error``, unless a vote already ended this load (every rank knows)."""
        if not self._settled:
            with contextlib.suppress(CheckpointError):
                self(error)


def stage_shard(changes: Installation, dtensor: DTensor, real: torch.Tensor,
                fsdp_param: Any = None, real_flat: torch.Tensor | None = None) -> None:
    """Stage ``real`` as ``dtensor``'s local tensor (and ``real_flat`` as FSDP2's padded
    flat shard, which ``real`` views), with what undoes it."""
    local = dtensor._local_tensor
    flat = None if real_flat is None else fsdp_param._sharded_param_data
    recorded = [target_of(f) for f in (local, flat) if isinstance(f, DeferredTensor)]
    requires_grad = local.requires_grad
    unmark: list[Callable[[], None]] = []

    def make() -> None:
        real.requires_grad_(requires_grad)  # after the in-place load
        if real_flat is not None:
            fsdp_param._sharded_param_data = real_flat
        dtensor._local_tensor = real
        # Later recorded writes to the deferred shard would never reach this one.
        unmark.append(mark_materialized(*recorded))

    def undo() -> None:
        dtensor._local_tensor = local
        if real_flat is not None:
            fsdp_param._sharded_param_data = flat
        while unmark:
            unmark.pop()()

    changes.stage_step(make, undo)


def stage_missing_shards(module: nn.Module, loaded: set[int], changes: Installation) -> None:
    """Replay the deferred shards the checkpoint lacks (``loaded``: ids of the DTensors it
    fills) and stage them; as :func:`torchdefer.distributed.materialize_module` makes them."""
    names = _parameter_names(module)
    done: set[int] = set(loaded)
    for fsdp_param in _fsdp2_params(module):
        dtensor = fsdp_param.sharded_param
        local = dtensor._local_tensor
        if id(dtensor) in done or not isinstance(local, DeferredTensor):
            continue
        done.add(id(dtensor))
        name = names.get(id(dtensor), repr(fsdp_param))
        flat = fsdp_param._sharded_param_data
        if same_recording(flat, local):
            real_flat, real_local = _replayed([flat, local], name)
            stage_shard(changes, dtensor, real_local, fsdp_param, real_flat)
        else:
            stage_shard(changes, dtensor, compact(_replayed([local], name)[0]))
    shared: dict[int, torch.Tensor] = {}  # id(deferred local) -> its real tensor
    for path, tensor in _dtensors(module):
        local = tensor._local_tensor
        if id(tensor) in done or not isinstance(local, DeferredTensor):
            continue
        if id(local) not in shared:
            shared[id(local)] = compact(_replayed([local], path)[0])
        stage_shard(changes, tensor, shared[id(local)])


def _replayed(fakes: list[DeferredTensor], name: str) -> list[torch.Tensor]:
    """:func:`replay_local`, whose marking of the storages waits for the commit."""
    return replay_local(fakes, name, mark=False)
