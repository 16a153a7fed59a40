"""save_state_dict for sharded models: every rank writes its own shards into one DCP directory.

A model whose parameters are DTensors (FSDP2 ``fully_shard``, tensor
parallel, HSDP) is written as ``dcp.save(model.state_dict())`` from every rank
would write it, without any rank holding more than its shards: each rank
replays its local tensors one at a time (from its own rows where the init
allows it, as :func:`torchdefer.distributed.materialize_module` does), and
DCP's planning makes one checkpoint of them, whose global tensors are eager
construction's. ``dcp.load`` reads it back under any parallelism, or none (a
torchtitan seed checkpoint made without one device holding the model).

Who writes what: a sharded tensor's chunk is written by the rank holding it,
and a chunk several ranks hold (the ``Replicate`` dimensions of a mesh, as in
HSDP) by the one at coordinate 0 of those dimensions; tensors that are not
DTensors (buffers, unsharded parameters), and extra state, by rank 0. So no
tensor is replayed on a rank that does not write it.

Not here: safetensors (a file holds whole tensors, which no rank has; refused
in :mod:`torchdefer.checkpoint._write`), and ``Partial`` placements (a pending
sum is not a value of the eager model; refused).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from torchdefer.checkpoint import _dcp_writer
from torchdefer.checkpoint._write import check_destination, publish, run_pipeline
from torchdefer.checkpoint._write_plan import Entry, plan_write, written_dtype
from torchdefer.distributed._columns import ColumnRows
from torchdefer.distributed.shard import compact
from torchdefer.errors import CheckpointExistsError, CheckpointUsageError, CheckpointWriteError
from torchdefer.materialize import Replay, ReplayError
from torchdefer.materialize._error_context import with_context
from torchdefer.materialize._value import replays_on_meta
from torchdefer.materialize.progress import ProgressSpec
from torchdefer.recorder import DeferredTensor, target_of

__all__ = ["save_sharded"]


def save_sharded(model: nn.Module, path: Path, *, dtype: torch.dtype | None,
                 progress: ProgressSpec) -> Path:
    """Write ``model``'s state dict as one DCP checkpoint, each rank its own shards.

    Called by :func:`torchdefer.save_state_dict` for models with DTensor tensors;
    every rank of the default process group must call it, with the same ``path``
    (on a filesystem all ranks share) and arguments.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise CheckpointUsageError(
            f"{type(model).__name__} has DTensor parameters but torch.distributed is not "
            "initialized; call save_state_dict on every rank after init_process_group.")
    rank = dist.get_rank()
    try:
        entries, specs, extras = _plan(model, dtype, rank)
        failure = None
    except Exception as e:  # told to every rank, so that none waits in a collective
        failure = e
    _refuse_together(failure)
    staging = _staging(path, rank)
    try:
        run_pipeline(entries, progress, cast=True, replay=_replay_shard,
                     writer=lambda pipeline: _dcp_writer.write_dcp(
                         staging, entries, extras, pipeline,
                         placeholder=lambda e: _placeholder(e, specs), ranks=True))
    except BaseException:
        # dcp.save raises on every rank when one fails; the others have stopped writing.
        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    dist.barrier()  # every rank's files, and rank 0's .metadata, are complete
    error = None
    if rank == 0:
        try:
            publish(staging, path)
        except CheckpointExistsError as e:
            shutil.rmtree(staging, ignore_errors=True)
            error = str(e)
    _raise_together(error)
    return path


def _plan(model: nn.Module, dtype: torch.dtype | None,
          rank: int) -> tuple[list[Entry], dict[int, DTensor], dict[str, Any]]:
    """This rank's entries, the DTensor of each sharded one, and the extra state."""
    state = model.state_dict(keep_vars=True)
    names: dict[int, list[str]] = {}
    for name, t in state.items():
        if isinstance(t, DTensor):
            names.setdefault(id(t), []).append(name)
    entries: list[Entry] = []
    specs: dict[int, DTensor] = {}
    for group in names.values():
        tensor = state[group[0]]
        if not _writes(tensor, group[0]):
            continue
        local = tensor._local_tensor
        _check_local(local, group[0])
        entry = Entry(tuple(group), local, written_dtype(local, dtype, group[0]))
        entries.append(entry)
        specs[id(entry)] = tensor
    rest = {k: v for k, v in state.items() if not isinstance(v, DTensor)}
    plan = plan_write(model, "dcp", dtype, rest) if rank == 0 else None
    if plan is not None:
        entries.extend(plan.entries)
    return entries, specs, (plan.extras if plan is not None else {})


def _writes(tensor: DTensor, name: str) -> bool:
    """Whether this rank writes its chunk of ``tensor``: the first replica of it."""
    for placement in tensor.placements:
        if placement.is_partial():
            raise CheckpointWriteError(
                f"'{name}' has placement {placement} ({tensor.placements}): a pending "
                "reduction, not a value eager construction gives. Redistribute it to "
                "Shard/Replicate placements before saving.")
    coordinate = tensor.device_mesh.get_coordinate()
    if coordinate is None:  # this rank is not in the tensor's mesh: it holds nothing
        return False
    # Shard and _StridedShard (TP + FSDP2) dimensions split the tensor; DCP's planner
    # computes each chunk's offsets from the placements.
    return all(c == 0 for c, p in zip(coordinate, tensor.placements, strict=True)
               if p.is_replicate())


def _check_local(local: torch.Tensor, name: str) -> None:
    if isinstance(local, DeferredTensor):
        if replays_on_meta(local):
            raise CheckpointWriteError(
                f"'{name}' was recorded on the meta device, so it has no values to write. "
                "Build the model with torchdefer.deferred_init outside torch.device('meta').")
    elif local.device.type == "meta" or local.layout != torch.strided:
        raise CheckpointWriteError(
            f"'{name}' has a local tensor on {local.device} with layout {local.layout}: no "
            "values save_state_dict can write. Materialize or load the model first.")


def _placeholder(entry: Entry, specs: dict[int, DTensor]) -> torch.Tensor:
    """What DCP plans from: a meta tensor, in the entry's DTensor layout if sharded."""
    meta = torch.empty(entry.shape, dtype=entry.dtype, device="meta")
    spec = specs.get(id(entry))
    if spec is None:
        return meta
    return DTensor.from_local(meta, spec.device_mesh, spec.placements, run_check=False,
                              shape=spec.shape, stride=spec.stride())


def _replay_shard(local: DeferredTensor, name: str) -> torch.Tensor:
    """One local tensor's values, from its rows where possible; the model stays deferred."""
    recorded = target_of(local)
    target = recorded.key
    replay = Replay(recorded.graph, None)
    # As shard.replay_local: TORCHDEFER_SHARD_ROWS=0 replays through the full parameter.
    rows = ColumnRows(replay, [target]) if os.environ.get("TORCHDEFER_SHARD_ROWS") != "0" \
        else None
    try:
        real = replay.run([target], [name], substitute=rows)[0]
    except ReplayError as e:
        message = f"While writing the local shard of '{name}' on rank {dist.get_rank()}: {e}"
        raise with_context(e, message) from e
    return compact(real)


def _staging(path: Path, rank: int) -> Path:
    """The directory every rank writes into, made by rank 0 once ``path`` is checked."""
    answer: list[Any] = [None]
    failure: BaseException | None = None
    if rank == 0:
        try:
            check_destination(path)
            staging = path.parent / f".{path.name}.partial-{uuid.uuid4().hex[:8]}"
            staging.mkdir(parents=True)
            answer = [("ok", str(staging))]
        except (CheckpointExistsError, OSError) as e:
            failure, answer = e, [("error", f"rank 0: {e}")]
    dist.broadcast_object_list(answer, src=0)  # every rank refuses together
    kind, text = answer[0]
    if kind == "error":
        raise failure if failure is not None else CheckpointExistsError(text)
    return Path(text)


def _refuse_together(failure: Exception | None) -> None:
    """Raise on every rank if the plan failed on any: its own error, or the first rank's."""
    outcomes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, None if failure is None else f"{failure}")
    if failure is not None:
        raise failure
    for rank, message in enumerate(outcomes):
        if message is not None:
            raise CheckpointWriteError(f"save_state_dict failed on rank {rank}: {message}")


def _raise_together(error: str | None) -> None:
    box = [error]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise CheckpointExistsError(box[0])
