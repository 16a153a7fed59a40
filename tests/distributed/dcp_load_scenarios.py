"""``dcp.load`` straight into deferred FSDP2 models (torchtitan's flow), on gloo ranks.

See test_dcp_load.py. Each scenario is ``(rank, world_size) -> None``: the
eager model is built from seed 0, sharded and loaded with ``dcp.load`` from a
checkpoint of a seed-1 model; the deferred model the same way; then the local
shards, a forward pass and the generator state are compared bit for bit, and
the random ops replayed are counted: an init the checkpoint overwrites is
dead and must not be drawn.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard

import torchdefer
import torchdefer.distributed as tdd
import torchdefer.materialize._local_call as local_call
import torchdefer.materialize._rng_replay as replay_rng
from torchdefer.distributed.shard import observe

ALL = [
    "dcp_load_into_a_deferred_fsdp2_model_matches_eager_and_draws_nothing",
    "keys_dcp_load_leaves_out_keep_eagers_init",
    "dcp_load_resharding_into_whole_shards_draws_nothing",
    "dcp_load_of_column_shards_into_row_shards_draws_nothing",
]

DIM, HIDDEN, VOCAB = 16, 24, 37  # 37 rows: rank 1's padded shard has padding


class Tiny(nn.Module):
    """torchtitan's init scheme in small: normal_ embedding, trunc_normal_ linears (the
    output's 3-sigma bounds make it a data-dependent rejection loop), RMSNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM)
        self.norm = nn.RMSNorm(DIM)
        self.out = nn.Linear(DIM, VOCAB, bias=False)
        nn.init.normal_(self.tok.weight)
        nn.init.trunc_normal_(self.w1.weight, std=0.02)
        nn.init.trunc_normal_(self.w2.weight, std=0.02)
        std = DIM**-0.5
        nn.init.trunc_normal_(self.out.weight, std=std, a=-3 * std, b=3 * std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x)
        return self.out(self.norm(h + self.w2(torch.relu(self.w1(h)))))


def _shard(model: nn.Module, mesh=None, placement=None) -> None:
    for layer in (model.w1, model.w2, model.out):
        fully_shard(layer, mesh=mesh, shard_placement_fn=placement)
    fully_shard(model, mesh=mesh, shard_placement_fn=placement)


def _columns(param: nn.Parameter) -> Shard:
    return Shard(1) if param.dim() == 2 else Shard(0)


def _checkpoint(world: int, name: str, placement=None) -> Path:
    """A DCP checkpoint of the seed-1 model, sharded over all ranks."""
    path = Path(os.environ["TORCHDEFER_TEST_CHECKPOINTS"], f"{name}-{world}")
    torch.manual_seed(1)
    saved = Tiny()
    _shard(saved, placement=placement)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # single-threaded gloo notes
        dcp.save(saved.state_dict(), checkpoint_id=path)
    dist.barrier()
    return path


def _load(model: nn.Module, path: Path, drop: tuple[str, ...] = ()) -> None:
    state = {k: v for k, v in model.state_dict().items() if k not in drop}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=path)


@contextlib.contextmanager
def _counting_draws() -> Iterator[dict[str, int]]:
    """Random calls replay runs (from exact states, into place or scratch), and their
    elements."""
    counts = {"ops": 0, "numbers": 0}
    draw = replay_rng.draw

    def counting(node, *args):
        out, after = draw(node, *args)
        counts["ops"] += 1
        counts["numbers"] += sum(t.numel() for t in (out if isinstance(out, (list, tuple))
                                                     else [out]) if isinstance(t, torch.Tensor))
        return out, after

    replay_rng.draw = local_call.draw = counting
    try:
        yield counts
    finally:
        replay_rng.draw = local_call.draw = draw


def _both(path: Path, drop: tuple[str, ...] = (), mesh=None):
    """(eager, deferred, eager's generator state after its load)."""
    torch.manual_seed(0)
    eager = Tiny()
    _shard(eager, mesh)
    _load(eager, path, drop)
    eager_rng = torch.get_rng_state()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(Tiny)
    _shard(model, mesh)
    _load(model, path, drop)
    assert torch.equal(torch.get_rng_state(), eager_rng), "recording moved the generator"
    return eager, model, eager_rng


def _check(eager: nn.Module, model: nn.Module, eager_rng: torch.Tensor) -> None:
    assert not torchdefer.is_deferred(model)
    for (name, ref), (_, param) in zip(eager.named_parameters(), model.named_parameters()):
        local, ref_local = param.to_local(), ref.to_local()
        assert torch.equal(local, ref_local), f"{name}: local shard differs from eager's"
        assert local.stride() == ref_local.stride(), name
    x = torch.arange(10).reshape(2, 5) % VOCAB
    assert torch.equal(model(x), eager(x)), "forward differs"
    # Materialization never moves the generator: it is where eager left it.
    assert torch.equal(torch.get_rng_state(), eager_rng)


def dcp_load_into_a_deferred_fsdp2_model_matches_eager_and_draws_nothing(
    rank: int, world: int
) -> None:
    path = _checkpoint(world, "all")
    eager, model, eager_rng = _both(path)
    with _counting_draws() as counts, observe() as seen:
        tdd.materialize_module(model)
    assert counts == {"ops": 0, "numbers": 0}, f"dead inits were replayed: {counts}"
    assert all(s.rows and s.drawn == 0 for s in seen), seen
    _check(eager, model, eager_rng)


def keys_dcp_load_leaves_out_keep_eagers_init(rank: int, world: int) -> None:
    """A key the load leaves out keeps eager's init, whose generator position is
    reached over the skipped inits before it (w1) and after it (out, data-dependent)."""
    path = _checkpoint(world, "part")
    eager, model, eager_rng = _both(path, drop=("w2.weight",))
    with observe() as seen:
        tdd.materialize_module(model)
    drawn = {s.name: s.drawn for s in seen if s.rows}
    assert len(drawn) == len(seen), seen  # every shard from its own rows
    assert drawn.pop("w2.weight") > 0 and not any(drawn.values()), seen
    _check(eager, model, eager_rng)


def dcp_load_of_column_shards_into_row_shards_draws_nothing(rank: int, world: int) -> None:
    """Saved with Shard(1) (columns), loaded into FSDP2's Shard(0): each row shard is
    written by one column block per saved chunk, a strided copy each."""
    path = _checkpoint(world, "columns", placement=_columns)
    eager, model, eager_rng = _both(path)
    with _counting_draws() as counts:
        tdd.materialize_module(model)
    assert counts == {"ops": 0, "numbers": 0}, f"dead inits were replayed: {counts}"
    _check(eager, model, eager_rng)


def dcp_load_resharding_into_whole_shards_draws_nothing(rank: int, world: int) -> None:
    """Saved sharded over all ranks, loaded into models each rank holds whole (a
    1-rank mesh): each local tensor is written by one copy per saved chunk, which
    together cover it."""
    path = _checkpoint(world, "reshard")
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "whole"))["whole"]
    eager, model, eager_rng = _both(path, mesh=mesh)
    with _counting_draws() as counts:
        tdd.materialize_module(model)
    assert counts == {"ops": 0, "numbers": 0}, f"dead inits were replayed: {counts}"
    for (name, ref), (_, param) in zip(eager.named_parameters(), model.named_parameters()):
        assert torch.equal(param.to_local(), ref.to_local()), name
    assert torch.equal(torch.get_rng_state(), eager_rng)
