"""materialize_dtensor: a deferred tensor made real directly in a DTensor layout."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor

from torchdefer.distributed.shard import compact, replay_local
from torchdefer.errors import UsageError
from torchdefer.recorder import DeferredTensor

__all__ = ["materialize_dtensor"]


def materialize_dtensor(
    tensor: torch.Tensor, mesh: DeviceMesh, placements: Sequence[Placement]
) -> DTensor:
    """The DTensor that ``distribute_tensor`` would make of the eager tensor, made locally.

    Each rank makes its slice for ``placements`` (``Shard(dim)``: its chunk,
    as ``torch.chunk`` splits it; ``Replicate()``: all of it): a ``Shard(0)``
    chunk from its own rows where the tensor's history allows it, a
    ``Shard(1)`` chunk from chunks of whole rows (keeping its columns), any
    other by replaying the full tensor and keeping the slice. No data is sent
    between ranks: every rank must have built ``tensor`` with the same seed,
    which makes the result the same as scattering the eager tensor from rank 0.

    Args:
        tensor: a deferred tensor holding the *full* (global) value. A real
            tensor is accepted too and sliced locally the same way.
        mesh: the device mesh; the shard is created on its device type.
        placements: one ``Shard(dim)`` or ``Replicate()`` per mesh dimension.

    Returns:
        A ``DTensor`` whose local tensor owns only its slice; an
        ``nn.Parameter`` if ``tensor`` is one (same ``requires_grad``).

    Example, run on each rank (``torchrun --nproc-per-node 2 this.py``)::

        import torch, torchdefer
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard
        from torchdefer.distributed import materialize_dtensor

        torch.distributed.init_process_group("gloo")
        torch.manual_seed(0)
        weight = torchdefer.deferred_init(torch.randn, 1024, 1024)
        mesh = init_device_mesh("cpu", (2,))
        shard = materialize_dtensor(weight, mesh, [Shard(0)])   # 512 x 1024 per rank
        torch.manual_seed(0)
        assert torch.equal(shard.full_tensor(), torch.randn(1024, 1024))
    """
    placements = list(placements)
    for placement in placements:
        if not isinstance(placement, (Shard, Replicate)):
            raise UsageError(
                f"materialize_dtensor supports Shard(dim) and Replicate() placements, got "
                f"{placement} in {placements}. A Partial placement holds values that do "
                "not exist in the eager tensor; materialize with Replicate() and "
                "redistribute the DTensor instead."
            )
    if len(placements) != mesh.ndim:
        raise UsageError(
            f"materialize_dtensor got {len(placements)} placements {placements} for a "
            f"{mesh.ndim}-dimensional mesh {mesh}; pass one placement per mesh dimension."
        )
    requires_grad = tensor.requires_grad
    with torch.no_grad():
        # src_data_rank=None: every rank slices its own copy (no scatter from
        # rank 0), which on a deferred tensor records the slicing ops.
        sharded = distribute_tensor(tensor.detach(), mesh, placements, src_data_rank=None)
    local = sharded._local_tensor
    if isinstance(local, DeferredTensor):
        real = compact(replay_local([local], _describe(tensor))[0])
    else:
        real = compact(local)
    out = DTensor.from_local(
        real, mesh, placements, run_check=False, shape=sharded.shape, stride=sharded.stride()
    )
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(out, requires_grad=requires_grad)  # type: ignore[return-value]
    out.requires_grad_(requires_grad)  # in place: it returns out itself
    return out


def _describe(tensor: torch.Tensor) -> str:
    return f"tensor of shape {tuple(tensor.shape)} and dtype {tensor.dtype}"
