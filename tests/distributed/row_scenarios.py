"""What each rank runs for the row-replay tests: shard, materialize, compare with eager.

Every scenario is ``(rank, world_size) -> None`` and raises on any mismatch.
Besides the values (every local shard equals the eager parameter's slice, bit
for bit), they check the *path*: parameters whose history allows it are made
from the rank's own rows (``torchdefer.distributed.shard.observe``), drawing
about as many numbers as the shard holds, and the rest fall back to the full
parameter and stay right.
"""

from __future__ import annotations

import copy
import math

import psutil
import torch
from scenarios import _build_both, _check_fsdp2_parity, _hf_models, _peak_rss, _reset_peak_rss
from scenarios import _shard_fsdp2 as shard_fsdp2
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import torchdefer
import torchdefer.distributed as tdd
from parity import trunc_normal_reads_data
from torchdefer.distributed.shard import observe

BLOCKS = 3 * 16  # a normal_ may draw two partial Box-Muller blocks and the 16-element tail


class Odd(nn.Module):
    """Row counts that do not divide by 2 or 4, element counts not multiples of 16."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(9, 37)  # kaiming uniform: 37 rows, 333 elements
        self.embedding = nn.Embedding(23, 5, padding_idx=11)  # normal_, then a zero row
        self.table = nn.Parameter(torch.randn(50, 3) * 0.5)  # randn, then an elementwise op
        self.low = nn.Parameter(torch.empty(41, 7, dtype=torch.bfloat16).normal_(0, 0.02))
        self.wide = nn.Parameter(torch.empty(6, 1000).uniform_(-1, 1))  # 6 rows, long rows
        self.vector = nn.Parameter(torch.empty(45).normal_())  # 1-D: rows are elements


class Mixed(nn.Module):
    """Some parameters whose init mixes elements: they fall back to the full parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = nn.Linear(12, 30)
        self.ortho = nn.Linear(12, 30)
        nn.init.orthogonal_(self.ortho.weight)
        # a quarter sigma: the uniform loop (rng.uniform_rejection), rows too
        self.trunc = nn.Parameter(
            nn.init.trunc_normal_(torch.empty(30, 8), std=0.02, a=-0.005, b=0.005)
        )
        self.titan = nn.Parameter(nn.init.trunc_normal_(torch.empty(30, 8), std=0.02))
        self.three_sigma = nn.Parameter(
            nn.init.trunc_normal_(torch.empty(30, 8), std=0.02, a=-0.06, b=0.06)
        )


def _fsdp2_rows(build, rank: int, world: int) -> list:
    eager, model = _build_both(build)
    shard_fsdp2(model)
    with observe() as seen:
        tdd.materialize_module(model)
    _check_fsdp2_parity(eager, model, rank, world)
    return seen


def fsdp2_shards_come_from_their_own_rows(rank: int, world: int) -> None:
    builds = {"odd": Odd, **_hf_models()}
    for name, build in builds.items():
        seen = _fsdp2_rows(build, rank, world)
        fallen = [(s.name, s.reason) for s in seen if not s.rows]
        assert not fallen, f"{name}: fell back: {fallen}"
        drawn = sum(s.drawn for s in seen)
        local = sum(s.numel for s in seen)
        # Hugging Face inits twice (module init, then _init_weights): only the
        # last overwrite is drawn, so a rank draws about its shard.
        assert drawn <= local + BLOCKS * len(seen), f"{name}: drew {drawn} for {local} elements"


def fsdp2_mixing_init_falls_back_and_stays_bit_for_bit(rank: int, world: int) -> None:
    seen = {s.name: s for s in _fsdp2_rows(Mixed, rank, world)}
    assert seen["plain.weight"].rows and seen["plain.bias"].rows
    assert seen["titan"].rows, "trunc_normal_ with bounds normal_ cannot reach is its normal_"
    if trunc_normal_reads_data():
        assert seen["three_sigma"].rows, "a normal_ rejection loop comes from its own rows"
    # The uniform loop since torch 2.12, erfinv of a uniform before: rows either way.
    assert seen["trunc"].rows, "trunc_normal_'s uniform loop comes from its own rows"
    assert not seen["ortho.weight"].rows, "orthogonal_ cannot come from its rows"
    assert seen["ortho.weight"].reason, "the fallback names the op that stopped it"


def fsdp2_bf16_model_converted_after_init_matches_eager(rank: int, world: int) -> None:
    def build():
        return _hf_models()["llama"]().to(torch.bfloat16)

    seen = _fsdp2_rows(build, rank, world)
    assert all(s.rows for s in seen), [(s.name, s.reason) for s in seen if not s.rows]


def fsdp2_row_path_peak_memory_is_the_shards(rank: int, world: int) -> None:
    """Sliceable parameters: no full parameter is ever allocated. A parameter that
    falls back (orthogonal_) costs one full parameter, once."""
    n_layers, width = 6, 2048
    param = width * width * 4  # 16 MiB
    # Jumps shorter than 2**22 words draw through a 4 MiB buffer (rng.mt19937).
    scratch = (4 << 20) + (2 << 20)

    def build():
        layers = [nn.Linear(width, width) for _ in range(n_layers)]
        nn.init.orthogonal_(layers[-1].weight)
        return nn.Sequential(*layers)

    model = torchdefer.deferred_init(build)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    sliceable = list(model)[:-1]
    _reset_peak_rss()
    before = psutil.Process().memory_info().rss
    with observe() as seen:
        tdd.materialize_module(sliceable[0])  # the first layers alone: all from rows
        for layer in sliceable[1:]:
            tdd.materialize_module(layer)
    peak = _peak_rss() - before
    shards = sum(p.to_local().untyped_storage().nbytes() for m in sliceable for p in m.parameters())
    assert peak < shards + scratch < shards + param // 2, (
        f"peak RSS increase {peak / 2**20:.1f} MiB: more than the shards "
        f"({shards / 2**20:.1f} MiB) + {scratch >> 20} MiB of scratch"
    )
    assert all(s.rows for s in seen)
    with observe() as seen:
        tdd.materialize_module(model)
    assert [s.name for s in seen if not s.rows] == ["5.weight"]


def hsdp_shards_come_from_their_own_rows(rank: int, world: int) -> None:
    shape = (1, 1) if world == 1 else (2, world // 2)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
    for build in (Odd, _hf_models()["llama"]):
        eager, model = _build_both(build)
        fully_shard(model, mesh=mesh)
        with observe() as seen:
            tdd.materialize_module(model)
        assert all(s.rows for s in seen), [(s.name, s.reason) for s in seen if not s.rows]
        coordinate, shards = mesh.get_local_rank("shard"), shape[1]
        reference = dict(eager.named_parameters())
        for name, param in model.named_parameters():
            chunks = torch.chunk(reference[name].detach(), shards, dim=0)
            expected = chunks[coordinate] if coordinate < len(chunks) else chunks[0][:0]
            assert torch.equal(param.to_local(), expected), f"{name}: local shard differs"


def tensor_parallel_colwise_rows_and_rowwise_columns_match_eager(rank: int, world: int) -> None:
    def build():
        return nn.Sequential(nn.Linear(6, 37), nn.ReLU(), nn.Linear(37, 6))

    eager, model = _build_both(build)
    mesh = init_device_mesh("cpu", (world,))
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    parallelize_module(model, mesh, plan, src_data_rank=None)
    with observe() as seen:
        tdd.materialize_module(model)
    paths = {s.name: s for s in seen}
    # Colwise shards rows (the row path); rowwise shards columns: chunks of whole rows,
    # never the full parameter (distributed/_columns.py).
    assert all(s.rows for s in seen), seen
    assert not paths["0.weight"].chunked and not paths["0.bias"].chunked, seen
    assert paths["2.weight"].chunked == (world > 1), seen
    reference = parallelize_module(eager, mesh, plan)
    theirs = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(param.to_local(), theirs[name].to_local()), name


def _stage(model: nn.Module, index: int, stages: int) -> tuple[nn.Module, dict[str, str]]:
    """Stage ``index`` of ``stages``, as torchtitan splits a model for pipelining:
    a deep copy with the other stages' layers and the unused ends removed."""
    layers = len(model.model.layers)
    per = math.ceil(layers / stages)
    keep = range(index * per, min(layers, (index + 1) * per))
    stage = copy.deepcopy(model)
    for i in reversed(range(layers)):
        if i not in keep:
            del stage.model.layers[i]
    if index > 0:
        stage.model.embed_tokens = None
    if index < stages - 1:
        stage.model.norm = None
        stage.lm_head = None
    names = {}
    for name, _ in stage.named_parameters():
        if name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            name_in_model = f"model.layers.{int(i) + keep.start}.{rest}"
        else:
            name_in_model = name
        names[name] = name_in_model
    return stage, names


def pipeline_stage_materializes_its_own_layers_bit_for_bit(rank: int, world: int) -> None:
    import transformers

    def build():
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=100))

    eager, model = _build_both(build)
    stage, names = _stage(model, rank, world)
    torchdefer.materialize_module(stage)
    assert not torchdefer.is_deferred(stage)
    reference = dict(eager.named_parameters())
    for name, param in stage.named_parameters():
        assert torch.equal(param, reference[names[name]]), f"stage {rank}: {name} differs"
    # The rest of the model stays deferred: the stage made only its own tensors.
    assert torchdefer.is_deferred(model)


ALL = [
    "fsdp2_row_path_peak_memory_is_the_shards",  # first: measures the RSS high-water mark
    "fsdp2_shards_come_from_their_own_rows",
    "fsdp2_mixing_init_falls_back_and_stays_bit_for_bit",
    "fsdp2_bf16_model_converted_after_init_matches_eager",
    "hsdp_shards_come_from_their_own_rows",
    "tensor_parallel_colwise_rows_and_rowwise_columns_match_eager",
    "pipeline_stage_materializes_its_own_layers_bit_for_bit",
]
