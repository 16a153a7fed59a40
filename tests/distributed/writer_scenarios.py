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
import weakref
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
    "hsdp_replicas_are_written_once_by_the_first_replica",
    "each_rank_holds_one_local_tensor_at_a_time_while_writing",
    "safetensors_of_a_sharded_model_is_refused_saying_to_use_dcp",
    "a_non_empty_destination_is_refused_on_every_rank",
    "a_partial_placement_is_refused_before_anything_is_written",
    "a_refusal_on_one_rank_is_a_refusal_on_every_rank",
]

# On 4 ranks (2 x 2 meshes): replicas that hold distinct shards.
FOUR = [
    "hsdp_on_a_two_by_two_mesh_writes_each_shard_once",
    "tensor_parallel_and_fsdp2_on_a_two_by_two_mesh_load_as_eager",
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


def _deferred(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
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
    # torchdefer.load_state_dict into a deferred model sharded the same way.
    target = _fsdp2(_deferred(seed=5))
    torchdefer.load_state_dict(target, path, strict=True)
    for name, tensor in target.state_dict().items():
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        assert torch.equal(full, eager.state_dict()[name]), f"{name}: torchdefer load differs"
    torchdefer.materialize_module(model)  # and it still materializes as eager
    for name, tensor in model.state_dict().items():
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        assert torch.equal(full, eager.state_dict()[name]), name
    # Once materialized, its real shards are written as they are.
    _quiet(torchdefer.save_state_dict, model, _path("fsdp2-real"), format="dcp")
    _loads_unsharded_as(_path("fsdp2-real"), eager.state_dict())


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
    files = _files(path)
    assert files["w1.weight"] == {f"__{r}_0.distcp" for r in range(world)}, files
    # w2.bias is Replicate (every rank holds it whole), freqs a plain buffer: rank 0's.
    assert files["w2.bias"] == files["freqs"] == {"__0_0.distcp"}, files


def hsdp_replicas_are_written_once_by_the_first_replica(rank: int, world: int) -> None:
    """HSDP over a (world, 1) mesh: every rank holds every parameter (Replicate, Shard over
    one rank); only the replica at coordinate 0 writes, and nothing is written twice."""
    path = _path("hsdp")
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
    model = _deferred()
    for layer in (model.w1, model.w2):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _quiet(torchdefer.save_state_dict, model, path, format="dcp")
    _loads_unsharded_as(path, _eager().state_dict())
    files = _files(path)
    assert set().union(*files.values()) == {"__0_0.distcp"}, files


def each_rank_holds_one_local_tensor_at_a_time_while_writing(rank: int, world: int) -> None:
    """The storages of the tensors a rank makes are tracked by weak reference: with no
    slack, the ones alive plus the next never exceed the rank's largest local tensor."""
    from torchdefer.checkpoint import _write as write
    from torchdefer.distributed import _save as save

    model = _fsdp2(_deferred())
    largest = max(t.to_local().nbytes if isinstance(t, DTensor) else t.nbytes
                  for t in model.state_dict().values())
    made, over = [], []
    replay = save._replay_shard

    def tracked(local, name):
        alive = {id(s): s for s in (r() for r in made)
                 if s is not None and torch._C._storage_Use_Count(s._cdata) > 0}
        held = sum(s.nbytes() for s in alive.values()) + local.nbytes
        if held > largest:
            over.append(f"{name}: {held} > {largest}")
        out = replay(local, name)
        made.append(weakref.ref(out.untyped_storage()))
        return out

    save._replay_shard, slack, write._SLACK_BYTES = tracked, write._SLACK_BYTES, 0
    try:
        _quiet(torchdefer.save_state_dict, model, _path("tracked"), format="dcp")
    finally:
        save._replay_shard, write._SLACK_BYTES = replay, slack
    assert made and not over, over


def _files(path: Path) -> dict[str, set[str]]:
    """{tensor name: the files holding its chunks}."""
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    files: dict[str, set[str]] = {}
    for index, info in metadata.storage_data.items():
        files.setdefault(index.fqn, set()).add(info.relative_path)
    return files


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


def hsdp_on_a_two_by_two_mesh_writes_each_shard_once(rank: int, world: int) -> None:
    """(Replicate, Shard(0)): ranks 0 and 1 hold the two shards, ranks 2 and 3 the same
    again; only the first replica (ranks 0 and 1) writes."""
    path = _path("hsdp4")
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    model = _deferred()
    for layer in (model.w1, model.w2):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _quiet(torchdefer.save_state_dict, model, path, format="dcp")
    _loads_unsharded_as(path, _eager().state_dict())
    files = _files(path)
    assert files["w1.weight"] == {"__0_0.distcp", "__1_0.distcp"}, files
    assert set().union(*files.values()) <= {"__0_0.distcp", "__1_0.distcp"}, files


def tensor_parallel_and_fsdp2_on_a_two_by_two_mesh_load_as_eager(rank: int, world) -> None:
    path = _path("tp-fsdp4")
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    model = _deferred()
    plan = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
    parallelize_module(model, mesh["tp"], plan, src_data_rank=None)
    for layer in (model.w1, model.w2):
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    _quiet(torchdefer.save_state_dict, model, path, format="dcp")
    _loads_unsharded_as(path, _eager().state_dict())


def a_partial_placement_is_refused_before_anything_is_written(rank: int, world: int) -> None:
    from torch.distributed.tensor import Partial

    from torchdefer.checkpoint import CheckpointWriteError

    path = _path("partial")
    mesh = init_device_mesh("cpu", (world,))
    model = _fsdp2(_deferred())
    pending = DTensor.from_local(torch.ones(3), mesh, [Partial()], run_check=False)
    model.register_buffer("pending", pending)
    try:
        _quiet(torchdefer.save_state_dict, model, path, format="dcp")
    except CheckpointWriteError as e:
        assert "'pending'" in str(e) and "pending reduction" in str(e), str(e)
    else:
        raise AssertionError("a Partial placement was written")
    dist.barrier()
    assert not path.exists()


def a_refusal_on_one_rank_is_a_refusal_on_every_rank(rank: int, world: int) -> None:
    """Rank 1's local tensor has no values (meta): rank 1 says so, the others name it, and
    no rank waits in a collective the other never reaches."""
    from torchdefer.checkpoint import CheckpointWriteError

    path = _path("one-rank")
    mesh = init_device_mesh("cpu", (world,))
    model = _fsdp2(_deferred())
    local = torch.empty(2, device="meta" if rank == 1 else "cpu")
    model.register_buffer("odd", DTensor.from_local(local, mesh, [Shard(0)], run_check=False))
    try:
        _quiet(torchdefer.save_state_dict, model, path, format="dcp")
    except CheckpointWriteError as e:
        expected = "'odd'" if rank == 1 else "failed on rank 1"
        assert expected in str(e) and "meta" in str(e), str(e)
    else:
        raise AssertionError(f"rank {rank} did not refuse")
    dist.barrier()
    assert not path.exists()
