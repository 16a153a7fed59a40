"""materialize_module for sharded modules: FSDP2 shards, DTensor parameters, the rest."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from torchdefer.distributed.shard import compact, replay_local, same_recording
from torchdefer.materialize import _parallel as parallel
from torchdefer.materialize import materialize_module as materialize_plain
from torchdefer.recorder import DeferredTensor

__all__ = ["materialize_module"]


def materialize_module(module: nn.Module, *, threads: int | None = None) -> nn.Module:
    """Materialize a deferred module whose parameters may be sharded, in place.

    Handles, in this order:

    1. parameters sharded by FSDP2 ``fully_shard``: each rank makes only its
       padded shard (what FSDP2 would have made from the eager parameter, bit
       for bit), from its own rows where the parameter's init allows it, else
       through the full parameter (see :mod:`torchdefer.distributed.shard`);
    2. other DTensor parameters and buffers whose local tensor is deferred
       (``distribute_tensor``, ``parallelize_module(..., src_data_rank=None)``);
    3. everything still deferred (buffers, unsharded parameters, tensors kept
       as plain attributes), through :func:`torchdefer.materialize_module`.

    The layouts must come from local slicing: ``fully_shard``,
    ``distribute_tensor(..., src_data_rank=None)``, ``parallelize_module(...,
    src_data_rank=None)``. With the default ``src_data_rank=0`` those raise at
    once (they would scatter rank 0's data, which no rank has yet).

    Peak memory per rank is its shards (and the unsharded tensors), plus the
    largest parameter that cannot come from its rows. Every rank must have
    built the model with the same seed; no communication is needed, so the
    global model is the same whatever the world size.

    Tensors are created on the device they report: the FSDP2 mesh's device
    for shards (``fully_shard`` records the move there), the recorded device
    for the rest.

    Args:
        module: a module built by :func:`torchdefer.deferred_init`, then
            sharded with ``fully_shard`` or DTensor parameters.
        threads: threads of this rank that draw each large CPU random fill
            (its rows too), each a chunk from its own jumped generator state;
            the bits are the same (see :mod:`torchdefer.materialize._parallel`).
            None: ``torch.get_num_threads()``.

    Returns:
        ``module`` itself.

    Example, run on each rank (``torchrun --nproc-per-node 2 this.py``)::

        import torch, torchdefer, torchdefer.distributed
        from torch.distributed.fsdp import fully_shard

        torch.distributed.init_process_group("gloo")
        torch.manual_seed(0)  # the same seed on every rank
        model = torchdefer.deferred_init(
            lambda: torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        torchdefer.distributed.materialize_module(model)
        assert not torchdefer.is_deferred(model[0].weight.to_local())
    """
    threads = parallel.check_threads(threads, "torchdefer.distributed.materialize_module")
    with parallel.threads_used(threads):
        return _materialize(module)


def _materialize(module: nn.Module) -> nn.Module:
    names = _parameter_names(module)
    for fsdp_param in _fsdp2_params(module):
        _materialize_fsdp_param(fsdp_param, names)
    done: dict[int, torch.Tensor] = {}  # id(deferred local) -> its real tensor
    for path, tensor in _dtensors(module):
        local = tensor._local_tensor
        if isinstance(local, DeferredTensor):
            if id(local) not in done:
                done[id(local)] = compact(replay_local([local], path)[0])
            tensor._local_tensor = done[id(local)]
    materialize_plain(module)
    return module


def _materialize_fsdp_param(fsdp_param, names: dict[int, str]) -> None:
    """Make one FSDP2 parameter's shard real, keeping FSDP2's storage layout.

    FSDP2 keeps two tensors per parameter: ``_sharded_param_data`` (the padded
    shard, flat) and the DTensor's local tensor (a view of it without the
    padding). Both are replayed in one run, so they share storage as FSDP2
    expects (its ``reset_sharded_param`` compares their storages).
    """
    dtensor = fsdp_param.sharded_param
    local = dtensor._local_tensor
    if not isinstance(local, DeferredTensor):
        return
    name = names.get(id(dtensor), repr(fsdp_param))
    flat = fsdp_param._sharded_param_data
    if same_recording(flat, local):
        real_flat, real_local = replay_local([flat, local], name)
        fsdp_param._sharded_param_data = real_flat
    else:
        real_local = compact(replay_local([local], name)[0])
    dtensor._local_tensor = real_local


def _fsdp2_params(module: nn.Module) -> Iterator:
    """Every ``FSDPParam`` of the modules ``fully_shard`` was applied to."""
    seen: set[int] = set()
    for sub in module.modules():
        if not isinstance(sub, FSDPModule):
            continue
        state = sub._get_fsdp_state()
        # torch>=2.10 keeps a list of groups (per-parameter meshes); older a single one.
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:
            group = state._fsdp_param_group
            groups = [] if group is None else [group]
        for group in groups:
            for fsdp_param in group.fsdp_params:
                if id(fsdp_param) not in seen:
                    seen.add(id(fsdp_param))
                    yield fsdp_param


def _dtensors(module: nn.Module) -> Iterator[tuple[str, DTensor]]:
    """(path, tensor) for every DTensor parameter and buffer, each object once."""
    seen: set[int] = set()
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for kind in ("_parameters", "_buffers"):
            for name, tensor in getattr(sub, kind).items():
                if isinstance(tensor, DTensor) and id(tensor) not in seen:
                    seen.add(id(tensor))
                    yield (f"{prefix}.{name}" if prefix else name), tensor


def _parameter_names(module: nn.Module) -> dict[int, str]:
    names: dict[int, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), name)
    return names
