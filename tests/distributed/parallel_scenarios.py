"""What each of 4 ranks runs for HSDP, TP and TP+FSDP2 on a torchtitan-init model.

The layouts are ``bench/titan_parallel.py``'s (torchtitan's TP plan: colwise
``wq``/``wk``/``wv``/``w1``/``w3``/output, rowwise ``wo``/``w2``/embedding), on
``bench/titan_model.py``'s Llama with odd sizes so that chunks are uneven.
Every scenario raises on any mismatch with eager PyTorch: the generator after
deferral, each local tensor against the same layout applied to the eager
model, each gathered parameter against the eager one, and the path (no
parameter built whole).
"""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import torch
from scenarios import _peak_rss, _reset_peak_rss
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import torchdefer
import torchdefer.distributed as tdd
from torchdefer.distributed import _columns as columns
from torchdefer.distributed.shard import observe

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: `bench`

from bench.titan_model import TitanArgs, TitanLlama
from bench.titan_parallel import apply_layout

# hidden 45 and vocab 67: colwise chunks of 23/22 rows, rowwise ones of 23/22 columns
ARGS = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden=45, vocab=67, max_seq_len=16)
ROWWISE = ("attention.wo.weight", "feed_forward.w2.weight")


def _both(layout: str, world: int):
    torch.manual_seed(0)
    eager = TitanLlama(TitanArgs(**ARGS))
    after_eager = torch.get_rng_state()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(TitanLlama, TitanArgs(**ARGS))
    assert torch.equal(torch.get_rng_state(), after_eager), "deferral left the generator elsewhere"
    apply_layout(eager, layout, world)  # real tensors: each rank slices its own copy
    apply_layout(model, layout, world)
    with observe() as seen:
        tdd.materialize_module(model)
    assert torch.equal(torch.get_rng_state(), after_eager), "materialization moved the generator"
    return eager, model, seen


def _check(layout: str, rank: int, world: int) -> None:
    torch.manual_seed(0)
    reference = dict(TitanLlama(TitanArgs(**ARGS)).named_parameters())
    eager, model, seen = _both(layout, world)
    assert not torchdefer.is_deferred(model), "a tensor stayed deferred"
    whole = [(s.name, s.reason) for s in seen if not s.rows]
    assert not whole, f"{layout}: built whole: {whole}"
    chunked = {s.name for s in seen if s.chunked}
    if layout.startswith("tp"):
        expected = {f"layers.{i}.{name}" for i in range(ARGS["n_layers"]) for name in ROWWISE}
        assert chunked == expected, f"{layout}: row chunks for {sorted(chunked)}"
    else:
        assert not chunked, chunked
    theirs = dict(eager.named_parameters())
    for name, param in model.named_parameters():
        mine, other = param, theirs[name]
        if isinstance(mine, DTensor):
            assert mine.placements == other.placements, name
            mine, other = mine.to_local(), other.to_local()
        assert torch.equal(mine, other), f"{layout}: {name}: local tensor differs on rank {rank}"
    for name, param in model.named_parameters():  # every rank gathers, in the same order
        full = param.full_tensor() if isinstance(param, DTensor) else param
        assert torch.equal(full, reference[name]), f"{layout}: {name}: gathered differs"


def hsdp_matches_eager_from_rows(rank: int, world: int) -> None:
    _check("hsdp", rank, world)


def tensor_parallel_matches_eager_with_rowwise_from_row_chunks(rank: int, world: int) -> None:
    _check("tp", rank, world)


def tensor_parallel_and_fsdp2_match_eager_with_rowwise_from_row_chunks(rank, world) -> None:
    _check("tp+fsdp", rank, world)


def tensor_parallel_peak_memory_is_the_shards_and_a_chunk(rank: int, world: int) -> None:
    """Rowwise and colwise 64 MiB linears (TP, then TP+FSDP2): never a whole parameter,
    and no copy of a shard beside it."""
    width, n = 4096, 3
    param = width * width * 4  # 64 MiB
    # a chunk of rows, the 4 MiB buffer jumps shorter than 2**22 words draw through
    # (rng.mt19937), and 2 MiB for the allocator
    scratch = 2 * columns.CHUNK_BYTES + (2 << 20)
    for layout in ("tp", "tp+fsdp"):

        def build():
            layers = [nn.Linear(width, width, bias=False) for _ in range(n)]
            for layer in layers:
                nn.init.trunc_normal_(layer.weight, std=0.02)
            return nn.Sequential(*layers)

        model = torchdefer.deferred_init(build)
        if layout == "tp":
            mesh = init_device_mesh("cpu", (world,))
        else:
            mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        tp = mesh if layout == "tp" else mesh["tp"]
        # the local tensor of colwise is a clone of a row range, of rowwise of a column block
        plan = {str(i): ColwiseParallel() if i % 2 else RowwiseParallel() for i in range(n)}
        parallelize_module(model, tp, plan, src_data_rank=None)
        if layout == "tp+fsdp":
            for layer in model:
                fully_shard(layer, mesh=mesh["dp"])
        _reset_peak_rss()
        before = psutil.Process().memory_info().rss
        with observe() as seen:
            tdd.materialize_module(model)
        peak = _peak_rss() - before
        shards = sum(p.to_local().untyped_storage().nbytes() for p in model.parameters())
        assert all(s.rows and s.chunked == (s.name != "1.weight") for s in seen), seen
        assert peak < shards + scratch < shards + param // 2, (
            f"{layout}: peak RSS increase {peak / 2**20:.1f} MiB: more than the shards "
            f"({shards / 2**20:.1f} MiB) + {scratch >> 20} MiB of scratch"
        )


ALL = [
    "tensor_parallel_peak_memory_is_the_shards_and_a_chunk",  # first: measures the RSS high-water mark
    "hsdp_matches_eager_from_rows",
    "tensor_parallel_matches_eager_with_rowwise_from_row_chunks",
    "tensor_parallel_and_fsdp2_match_eager_with_rowwise_from_row_chunks",
]
