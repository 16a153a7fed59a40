"""``torchdefer.save_state_dict`` of sharded deferred models, on gloo ranks.

See test_sharded_writer.py. Each scenario is ``(rank, world_size) -> None``:
the deferred model is built from seed 0 on every rank, sharded (FSDP2, tensor
parallel), and written with ``format="dcp"`` by every rank; the checkpoint is
then read with ``dcp.load`` into an unsharded model on every rank and into a
model sharded another way, and compared with eager construction from seed 0.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import torchdefer
from torchdefer.checkpoint import CheckpointExistsError, CheckpointUsageError

ALL = [
    "fsdp2_model_written_by_every_rank_loads_as_eager_unsharded_and_resharded",
    "fsdp2_model_written_in_bfloat16_loads_as_eager_then_to_bfloat16",
    "tensor_parallel_model_written_by_every_rank_loads_as_eager",
    "safetensors_of_a_sharded_model_is_refused_saying_to_use_dcp",
    "a_non_empty_destination_is_refused_on_every_rank",
]

DIM, HIDDEN, VOCAB = 16, 24, 37  # 37 rows: uneven FSDP2 shards, rank 1's padded


class Tiny(nn.Module):
    """torchtitan's init scheme in small, with a tie, a bias and a plain buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM)
        self.norm = nn.RMSNorm(DIM)
        self.out = nn.Linear(DIM, VOCAB, bias=False)
        self.out.weight = self.tok.weight
        self.register_buffer("freqs", torch.rand(8) * 0.5)
        nn.init.normal_(self.tok.weight)
        nn.init.trunc_normal_(self.w1.weight, std=0.02)
        nn.init.trunc_normal_(self.w2.weight, std=0.02)


def _fsdp2(model: nn.Module, placement=None) -> nn.Module:
    for layer in (model.w1, model.w2):
        fully_shard(layer, shard_placement_fn=placement)
    fully_shard(model, shard_placement_fn=placement)
    return model


def _columns(param: nn.Parameter) -> Shard:
    return Shard(1) if param.dim() == 2 else Shard(0)


def _path(name: str) -> Path:
    return Path(os.environ["TORCHDEFER_TEST_CHECKPOINTS"], name)


def _eager(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny()


def _deferred() -> Tiny:
    torch.manual_seed(0)
    return torchdefer.deferred_init(Tiny)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gloo's and DCP's notes
        return fn(*args, **kwargs)


def _loads_unsharded_as(path: Path, expected: dict[str, torch.Tensor]) -> None:
    """``dcp.load`` into a whole model (another seed) on this rank gives ``expected``."""
    state = {k: v.to(expected[k].dtype) for k, v in _eager(seed=5).state_dict().items()}
    _quiet(dcp.load, state, checkpoint_id=str(path), no_dist=True)  # strict: every key
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), f"{name}: loaded differs from eager"


def fsdp2_model_written_by_every_rank_loads_as_eager_unsharded_and_resharded(
        rank: int, world: int) -> None:
    path = _path("fsdp2")
    model = _fsdp2(_deferred())
    out = _quiet(torchdefer.save_state_dict, model, path, format="dcp")
    assert out == path and torchdefer.is_deferred(model), "the model must stay deferred"
    files = sorted(p.name for p in path.iterdir())
    assert files == [".metadata", *[f"__{r}_0.distcp" for r in range(world)]], files
    eager = _eager()
    _loads_unsharded_as(path, eager.state_dict())
    # What dcp.save of the eager FSDP2 model from every rank describes, chunk for chunk.
    reference = _path("fsdp2-eager")
    _quiet(dcp.save, _fsdp2(_eager()).state_dict(), checkpoint_id=str(reference))
    dist.barrier()
    mine = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    theirs = dcp.FileSystemReader(str(reference)).read_metadata().state_dict_metadata
    assert mine == theirs
    # Resharded: into FSDP2 shards of columns (Shard(1)), a distributed load.
    other = _fsdp2(_eager(seed=5), placement=_columns)
    state = other.state_dict()
    _quiet(dcp.load, state, checkpoint_id=str(path))
    for name, tensor in eager.state_dict().items():
        got = state[name].full_tensor() if isinstance(state[name], DTensor) else state[name]
        assert torch.equal(got, tensor), f"{name}: resharded load differs from eager"
    torchdefer.materialize_module(model)  # and it still materializes as eager
    for name, tensor in model.state_dict().items():
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        assert torch.equal(full, eager.state_dict()[name]), name


def fsdp2_model_written_in_bfloat16_loads_as_eager_then_to_bfloat16(rank: int, world) -> None:
    path = _path("fsdp2-bf16")
    _quiet(torchdefer.save_state_dict, _fsdp2(_deferred()), path, format="dcp",
           dtype=torch.bfloat16)
    _loads_unsharded_as(path, _eager().to(torch.bfloat16).state_dict())


def tensor_parallel_model_written_by_every_rank_loads_as_eager(rank: int, world: int) -> None:
    """Colwise (Shard(0)) and rowwise (Shard(1), its bias Replicate: rank 0 writes it)."""
    path = _path("tp")
    mesh = init_device_mesh("cpu", (world,))
    model = _deferred()
    plan = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
    parallelize_module(model, mesh, plan, src_data_rank=None)
    _quiet(torchdefer.save_state_dict, model, path, format="dcp")
    _loads_unsharded_as(path, _eager().state_dict())


def safetensors_of_a_sharded_model_is_refused_saying_to_use_dcp(rank: int, world) -> None:
    path = _path(f"refused-{rank}")
    try:
        torchdefer.save_state_dict(_fsdp2(_deferred()), path)
    except CheckpointUsageError as e:
        assert "format='dcp'" in str(e) and "Tiny" in str(e), str(e)
    else:
        raise AssertionError("safetensors of a sharded model was not refused")
    assert not path.exists()


def a_non_empty_destination_is_refused_on_every_rank(rank: int, world: int) -> None:
    path = _path("taken")
    if rank == 0:
        path.mkdir()
        (path / "keep.txt").write_text("mine")
    dist.barrier()
    try:
        _quiet(torchdefer.save_state_dict, _fsdp2(_deferred()), path, format="dcp")
    except CheckpointExistsError as e:
        assert "not empty" in str(e), str(e)
    else:
        raise AssertionError(f"rank {rank} wrote into a non-empty directory")
    dist.barrier()
    assert sorted(p.name for p in path.iterdir()) == ["keep.txt"]
    assert not any(p.name.startswith(".taken.partial") for p in path.parent.iterdir())
