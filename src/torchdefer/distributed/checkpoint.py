"""Checkpoints into sharded deferred modules, and ``torch.distributed.checkpoint`` (DCP).

:func:`torchdefer.load_state_dict` hands two cases here (the core never imports
``torch.distributed``):

* a DCP directory (``dcp.save(model.state_dict(), checkpoint_id=path)``), for
  any module: real tensors are allocated for the keys the checkpoint has (for
  a sharded parameter, only this rank's shard), ``dcp.load`` fills them in
  place (resharding as needed), and they are put where the deferred ones were;
* a module sharded with FSDP2 ``fully_shard`` or DTensor parameters, for any
  source: from a full state dict or safetensors file, each rank copies its
  slice of each tensor into a shard of its own and frees the full tensor.

FSDP2 keeps a padded flat shard and the parameter's local tensor as a view of
it; both are rebuilt with the layout the deferred ones recorded, so FSDP2 sees
what it built itself. Afterwards :func:`torchdefer.distributed.materialize_module`
materializes what the checkpoint lacked. Peak per rank: its loaded shards, the
missing tensors' shards, and one full tensor (full sources only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from torchdefer.distributed.module import _fsdp2_params
from torchdefer.distributed.module import materialize_module as materialize_sharded
from torchdefer.materialize import materialize_module as materialize_plain
from torchdefer.materialize.checkpoint import (
    LoadResult,
    TensorGroup,
    _pick,
    assign_loaded,
    is_dcp_checkpoint,
    loaded_nbytes,
    open_checkpoint,
    plan_keys,
    tensor_groups,
)
from torchdefer.materialize.progress import Progress, ProgressSpec
from torchdefer.recorder import DeferredTensor

__all__ = ["load_state_dict"]


def load_state_dict(
    module: nn.Module,
    source: Any,
    *,
    strict: bool = False,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
    materialize_missing: bool = True,
    progress: ProgressSpec = None,
) -> LoadResult:
    """:func:`torchdefer.load_state_dict` for DCP checkpoints and sharded modules.

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
    groups = tensor_groups(module)
    sharded = any(_is_sharded(g.tensor) for g in groups)
    if sharded and (dtype is not None or device is not None):
        raise TypeError(
            "The module is sharded (FSDP2 or DTensor parameters): its shards are created on "
            "their mesh's device in their recorded dtype. Call load_state_dict without "
            "device= and dtype= (convert before sharding, or use FSDP2's MixedPrecisionPolicy)."
        )
    if is_dcp_checkpoint(source):
        result = _load_dcp(module, groups, Path(source), strict, device, dtype, progress)
    else:
        checkpoint = open_checkpoint(source)
        result = plan_keys(groups, checkpoint.keys, strict, checkpoint.where)
        present = set(checkpoint.keys)
        work = [(g, [n for n in g.names if n in present]) for g in groups]
        work = [(g, names) for g, names in work if names]
        fsdp = _fsdp_params_by_tensor(module)
        with Progress("load", len(work), _bytes(work, dtype), progress) as bar:
            for group, names in work:
                full = _pick(group, names, checkpoint)
                if _is_sharded(group.tensor):
                    local, install = _empty_shard(group.tensor, fsdp)
                    with torch.no_grad():
                        local.copy_(_slice(full, group.tensor, local.device))
                    install()
                else:
                    local = assign_loaded(group, full, device, dtype)
                del full
                bar.advance(names[0], local.nbytes)
    if materialize_missing:
        if sharded:
            materialize_sharded(module)
        else:
            materialize_plain(module, device, dtype=dtype, progress=progress)
    return result


def _load_dcp(module, groups, path: Path, strict, device, dtype, progress) -> LoadResult:
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    keys = list(metadata.state_dict_metadata)
    result = plan_keys(groups, keys, strict, str(path))
    present = set(keys)
    fsdp = _fsdp_params_by_tensor(module)
    targets: dict[str, torch.Tensor] = {}
    finish = []
    for group in groups:
        names = [n for n in group.names if n in present]
        if not names:
            continue
        tensor = group.tensor
        if _is_sharded(tensor):
            local, install = _empty_shard(tensor, fsdp)
            targets[names[0]] = DTensor.from_local(
                local, tensor.device_mesh, tensor.placements, run_check=False,
                shape=tensor.shape, stride=tensor.stride(),
            )
            finish.append((names[0], install, local))
        elif isinstance(tensor, DeferredTensor):
            place = device or tensor.fake_device
            empty = torch.empty(tensor.shape, dtype=tensor.dtype, device=place)
            targets[names[0]] = empty
            finish.append((names[0], _assigner(group, empty, device, dtype), empty))
        else:
            targets[names[0]] = tensor.detach()  # real already: DCP loads in place
    dcp.load(targets, checkpoint_id=str(path))
    with Progress("load", len(finish), sum(t.nbytes for _, _, t in finish), progress) as bar:
        for name, install, local in finish:
            install()
            bar.advance(name, local.nbytes)
    return result


def _assigner(group: TensorGroup, real: torch.Tensor, device, dtype):
    return lambda: assign_loaded(group, real, device, dtype)


def _is_sharded(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, DTensor) and isinstance(tensor._local_tensor, DeferredTensor)


def _fsdp_params_by_tensor(module: nn.Module) -> dict[int, Any]:
    return {id(p.sharded_param): p for p in _fsdp2_params(module)}


def _empty_shard(dtensor: DTensor, fsdp: dict[int, Any]):
    """A real, zeroed local shard laid out as the deferred one, and how to install it."""
    local = dtensor._local_tensor
    fsdp_param = fsdp.get(id(dtensor))
    flat = None if fsdp_param is None else fsdp_param._sharded_param_data
    if isinstance(flat, DeferredTensor) and flat._graph is local._graph:
        # FSDP2: the padded flat shard, with the local tensor a view into it
        # (padding zeroed, as fully_shard's new_zeros left it).
        real_flat = torch.zeros(flat.shape, dtype=flat.dtype, device=flat.fake_device)
        real = real_flat.as_strided(local.shape, local.stride(), local.storage_offset())
    else:
        real_flat = None
        real = torch.empty(local.shape, dtype=local.dtype, device=local.fake_device)

    def install() -> None:
        real.requires_grad_(local.requires_grad)  # after the in-place load
        if real_flat is not None:
            fsdp_param._sharded_param_data = real_flat
            flat._value.storage.materialized = True
        dtensor._local_tensor = real
        # Later recorded writes to the deferred shard would never reach this one.
        local._value.storage.materialized = True

    return real, install


def _slice(full: torch.Tensor, dtensor: DTensor, device: torch.device) -> torch.Tensor:
    """This rank's part of ``full`` for ``dtensor``'s placements (a view where possible)."""
    with torch.no_grad():
        full = full.detach().to(device=device, dtype=dtensor.dtype)
        # src_data_rank=None: every rank slices its own copy, no communication.
        sharded = distribute_tensor(full, dtensor.device_mesh, dtensor.placements,
                                    src_data_rank=None)
    return sharded.to_local()


def _bytes(work: list[tuple[TensorGroup, list[str]]], dtype: torch.dtype | None) -> int:
    total = 0
    for group, _ in work:
        t = group.tensor
        if isinstance(t, DTensor):
            total += t._local_tensor.numel() * t._local_tensor.element_size()
        else:
            total += loaded_nbytes(t, dtype)
    return total
