"""Checkpoints into modules sharded with FSDP2 ``fully_shard`` or DTensor parameters.

:func:`torchdefer.load_state_dict` hands sharded modules here (the checkpoint
package never imports ``torchdefer.distributed``). The checkpoint is validated
as for any module (:mod:`torchdefer.checkpoint._plan`: keys, shapes, entries,
devices), then every shard is prepared, then all are installed, all or
nothing on every rank:

* from a DCP directory (``dcp.save(model.state_dict(), checkpoint_id=path)``),
  real tensors are allocated for the keys the checkpoint has (for a sharded
  parameter, only this rank's shard) and ``dcp.load`` fills them through
  :mod:`torchdefer.checkpoint._dcp`'s safe reader (resharding as needed);
* from a full state dict, ``torch.save`` or safetensors file, each rank
  copies its slice of each tensor into a shard of its own and frees the
  full tensor.

FSDP2 keeps a padded flat shard and the parameter's local tensor as a view of
it; both are rebuilt with the layout the deferred ones recorded, so FSDP2 sees
what it built itself. What the checkpoint lacks is replayed before anything is
installed, as :func:`torchdefer.distributed.materialize_module` makes it.
Peak per rank: its loaded shards, the missing tensors' shards, and one full
tensor (full sources only).

All or nothing, on every rank: each rank stages its changes in an
:class:`~torchdefer.checkpoint._install.Installation` (the unsharded loader's:
swaps checked first, copies into real tensors last) and makes the undoable
ones; then the ranks vote (one ``all_gather_object``,
:class:`~torchdefer.distributed._staged.Vote`). If any rank failed, at any
point before, every rank undoes its changes and raises; the failing one its
own error, the others :class:`~torchdefer.checkpoint.CheckpointRankError`.
Ranks also vote before ``dcp.load``, so that a rank failing earlier does not
leave the others waiting in its collectives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeGuard, cast

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from torchdefer.checkpoint._assign import pick_tied, prepare, same_values, tie_mismatch
from torchdefer.checkpoint._install import Installation
from torchdefer.checkpoint._load import _install_views, _stage_missing, loaded_nbytes, open_source
from torchdefer.checkpoint._module_rules import kept_keys
from torchdefer.checkpoint._plan import (
    LoadResult,
    check_devices,
    check_entries,
    plan_keys,
    work_list,
)
from torchdefer.checkpoint._source import CheckpointSource, Source
from torchdefer.checkpoint._targets import TensorGroup, tensor_groups
from torchdefer.distributed._module import _fsdp2_params
from torchdefer.distributed._staged import Vote, stage_missing_shards, stage_shard
from torchdefer.distributed.shard import same_recording
from torchdefer.errors import CheckpointUsageError
from torchdefer.fake import _pinned
from torchdefer.materialize.progress import Progress, ProgressSpec
from torchdefer.recorder import DeferredTensor, target_of

__all__ = ["load_state_dict"]

Work = list[tuple[TensorGroup, list[str]]]


def load_state_dict(
    module: nn.Module,
    source: Source,
    *,
    strict: bool = False,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
    materialize_missing: bool = True,
    progress: ProgressSpec = None,
) -> LoadResult:
    """:func:`torchdefer.load_state_dict` for FSDP2/DTensor-sharded modules.

    Called by :func:`torchdefer.load_state_dict`; the arguments are its own.

    Example, run on each rank (``torchrun --nproc-per-node 2 this.py``)::

        import torch, torchdefer
        import torch.distributed.checkpoint as dcp
        from torch.distributed.fsdp import fully_shard

        torch.distributed.init_process_group("gloo")
        torch.manual_seed(0)  # the same seed on every rank
        model = torchdefer.deferred_init(Transformer, config)
        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
        torchdefer.load_state_dict(model, "checkpoints/step-1000")  # dcp.save'd
    """
    if dtype is not None or device is not None:
        raise CheckpointUsageError(
            "The module is sharded (FSDP2 or DTensor parameters): its shards are created on "
            "their mesh's device in their recorded dtype. Call load_state_dict without "
            "device= and dtype= (convert before sharding, or use FSDP2's MixedPrecisionPolicy)."
        )
    vote = Vote(str(source))
    changes = Installation()
    try:
        result, views = _stage(module, source, strict, materialize_missing, progress,
                               changes, vote)
    except BaseException as error:
        vote.refuse(error)  # the other ranks refuse too, at their next vote
        raise
    # Every rank made every change it can undo, or none: the vote is taken
    # after them, so a failure anywhere undoes them on every rank.
    changes.commit(then=(lambda: _install_views(module, views, None, None)) if views else None,
                   agree=vote)
    return result


def _stage(module: nn.Module, source: Any, strict: bool, materialize_missing: bool,
           progress: ProgressSpec, changes: Installation, vote: Vote):
    """Validate, read and prepare every change of this rank; the module is untouched."""
    groups = tensor_groups(module)
    checkpoint = open_source(source)
    vote.where = checkpoint.where
    result = plan_keys(groups, checkpoint, strict, kept_keys(module, checkpoint.versions))
    work = work_list(groups, checkpoint)
    check_entries(work, checkpoint)
    plain = [g for g in groups if not _is_sharded(g.tensor)]
    check_devices(plain, {id(g.tensor) for g, _ in work}, None, materialize_missing)
    fsdp = _fsdp_params_by_tensor(module)
    with Progress("load", len(work), _bytes(work), progress) as bar:
        if checkpoint.kind == "DCP":
            _prepare_dcp(work, checkpoint, fsdp, bar, changes, vote)
        else:
            _prepare_full(work, checkpoint, fsdp, bar, changes)
    views: dict = {}
    if materialize_missing:
        stage_missing_shards(module, {id(g.tensor) for g, _ in work}, changes)
        # Every deferred shard's storage (FSDP2's padded flat shard shares it)
        # has its real one staged now: the walk below must not replay it again.
        shards = frozenset(id(target_of(t._local_tensor).storage) for t in module.parameters()
                           if isinstance(t, DTensor)
                           and isinstance(t._local_tensor, DeferredTensor))
        views = _stage_missing(module, changes, work, None, None, progress, shards)
    return result, views


def _prepare_full(work: Work, checkpoint: CheckpointSource, fsdp, bar,
                  changes: Installation) -> None:
    taken: set = set()
    for group, names in work:
        full = pick_tied(group, names, {n: checkpoint.read(n) for n in names}, checkpoint.where)
        if _is_sharded(group.tensor):
            local = _stage_shard(group.tensor, fsdp, changes)
            with torch.no_grad():
                local.copy_(_slice(full, group.tensor, local.device))
        else:
            local = prepare(group, full, None, None, taken)
            changes.stage_loaded(group.tensor, local, group.path)
        del full
        bar.advance(names[0], local.nbytes)


def _prepare_dcp(work: Work, checkpoint: CheckpointSource, fsdp, bar,
                 changes: Installation, vote: Vote) -> None:
    """One ``dcp.load`` into fresh shards and tensors; tied names are all read and compared."""
    from torchdefer.checkpoint._dcp import load_into

    targets: dict[str, torch.Tensor] = {}
    sharded = []
    for group, names in work:
        tensor = group.tensor
        if _is_sharded(tensor):
            local = _stage_shard(tensor, fsdp, changes)
            for name in names:  # tied names: each read into a shard of its own, compared below
                own = local if name == names[0] else torch.empty_like(local)
                targets[name] = DTensor.from_local(
                    own, tensor.device_mesh, tensor.placements, run_check=False,
                    shape=tensor.shape, stride=tensor.stride(),
                )
            sharded.append((names[0], local))
        else:
            for name in names:
                entry = checkpoint.entries[name]
                targets[name] = torch.empty(entry.shape, dtype=entry.dtype, device="cpu")
    vote()  # dcp.load's collectives: entered by every rank or by none
    load_into(targets, Path(checkpoint.where), checkpoint.handle, no_dist=False)
    _check_sharded_ties(work, targets, checkpoint.where)
    taken: set = set()
    for group, names in work:
        if _is_sharded(group.tensor):
            continue
        loaded = pick_tied(group, names, targets, checkpoint.where)
        real = prepare(group, loaded, None, None, taken)
        changes.stage_loaded(group.tensor, real, group.path)
        bar.advance(names[0], real.nbytes)
    for name, local in sharded:
        bar.advance(name, local.nbytes)


def _check_sharded_ties(work: Work, targets: dict[str, torch.Tensor], where: str) -> None:
    """Tied names of sharded tensors hold the same values, NaN-equal as ``pick_tied``
    compares: each rank compares its shards, and all ranks learn of any mismatch
    (one ``all_reduce``), so all refuse together."""
    pairs = [(names[0], other) for group, names in work if _is_sharded(group.tensor)
             for other in names[1:]]
    if not pairs:
        return  # the same on every rank: the module and checkpoint are
    local = {name: _local(targets[name]) for pair in pairs for name in pair}
    differ = torch.tensor(
        [not same_values(local[a], local[b]) for a, b in pairs],
        dtype=torch.int32, device=local[pairs[0][0]].device,
    )
    torch.distributed.all_reduce(differ)
    for (first, other), count in zip(pairs, differ.tolist()):
        if count:
            raise tie_mismatch(first, other, where)


def _is_sharded(tensor: torch.Tensor) -> TypeGuard[DTensor]:
    return isinstance(tensor, DTensor) and isinstance(tensor._local_tensor, DeferredTensor)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded target's local shard (the targets of sharded tensors are DTensors)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _fsdp_params_by_tensor(module: nn.Module) -> dict[int, Any]:
    return {id(p.sharded_param): p for p in _fsdp2_params(module)}


def _stage_shard(dtensor: DTensor, fsdp: dict[int, Any], changes: Installation) -> torch.Tensor:
    """A real, zeroed local shard laid out as the deferred one (filled by the caller),
    staged to replace it."""
    local = cast(DeferredTensor, dtensor._local_tensor)  # _is_sharded: a deferred shard
    fsdp_param = fsdp.get(id(dtensor))
    flat = None if fsdp_param is None else fsdp_param._sharded_param_data
    if same_recording(flat, local):
        # FSDP2: the padded flat shard, with the local tensor a view into it
        # (padding zeroed, as fully_shard's new_zeros left it).
        real_flat = torch.zeros(flat.shape, dtype=flat.dtype, device=flat.fake_device)
        if target_of(flat).storage.pinned:  # CPUOffloadPolicy(pin_memory=True) pinned it
            real_flat = _pinned.pin(real_flat)
        real = real_flat.as_strided(local.shape, local.stride(), local.storage_offset())
        stage_shard(changes, dtensor, real, fsdp_param, real_flat)
    else:
        real = torch.empty(local.shape, dtype=local.dtype, device=local.fake_device)
        if target_of(local).storage.pinned:
            real = _pinned.pin(real)
        stage_shard(changes, dtensor, real)
    return real


def _slice(full: torch.Tensor, dtensor: DTensor, device: torch.device) -> torch.Tensor:
    """This rank's part of ``full`` for ``dtensor``'s placements (a view where possible)."""
    with torch.no_grad():
        full = full.detach().to(device=device, dtype=dtensor.dtype)
        # src_data_rank=None: every rank slices its own copy, no communication.
        sharded = distribute_tensor(full, dtensor.device_mesh, dtensor.placements,
                                    src_data_rank=None)
    return sharded.to_local()


def _bytes(work: Work) -> int:
    total = 0
    for group, _ in work:
        t = group.tensor
        if isinstance(t, DTensor):
            total += t._local_tensor.numel() * t._local_tensor.element_size()
        else:
            total += loaded_nbytes(t, None)
    return total
