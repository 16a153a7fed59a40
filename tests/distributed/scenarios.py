"""What each rank runs: build eagerly and deferred from one seed, shard, compare.

Every scenario is ``(rank, world_size) -> None`` and raises on any mismatch.
Collectives (``full_tensor``, FSDP all-gathers) run on every rank before any
comparison, so one failing rank never leaves the others waiting.
"""

from __future__ import annotations

from collections.abc import Callable

import psutil
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import torchdefer
import torchdefer.distributed as tdd


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3), nn.BatchNorm1d(3))


def _encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


def _embedding_conv() -> nn.Module:
    return nn.Sequential(nn.Embedding(10, 6, padding_idx=2), nn.Conv1d(6, 4, 3), nn.LayerNorm(4))


TORCH_NN = {"mlp": _mlp, "encoder": _encoder, "embedding_conv": _embedding_conv}


def _hf_models() -> dict[str, Callable[[], nn.Module]]:
    import transformers

    return {
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=100)),
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
            bos_token_id=0, eos_token_id=0)),
        "bert": lambda: transformers.BertModel(transformers.BertConfig(
            num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
            vocab_size=100)),
    }


# ---- helpers -------------------------------------------------------------------------


def _build_both(build: Callable[[], nn.Module], seed: int = 0):
    torch.manual_seed(seed)
    eager = build()
    torch.manual_seed(seed)
    return eager, torchdefer.deferred_init(build)


def _shard_fsdp2(model: nn.Module) -> None:
    """As users shard: each block (a child owning parameters, or its layers), then the root."""
    for child in model.children():
        blocks = child if isinstance(child, nn.ModuleList) else None
        for attr in ("layers", "layer", "h"):  # llama, bert, gpt2
            blocks = blocks or getattr(child, attr, None)
        for block in blocks if isinstance(blocks, nn.ModuleList) else [child]:
            if any(True for _ in block.parameters()):
                fully_shard(block)
    fully_shard(model)


def _expected_shard(full: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """The slice of ``full`` FSDP2 gives ``rank`` (torch.chunk on dim 0, empty past the end)."""
    chunks = torch.chunk(full, world, dim=0)
    if rank < len(chunks):
        return chunks[rank]
    return full.new_empty((0, *full.shape[1:]))


def _check_fsdp2_parity(eager: nn.Module, model: nn.Module, rank: int, world: int) -> None:
    assert not torchdefer.is_deferred(model), "a plain tensor stayed deferred"
    params = dict(model.named_parameters(remove_duplicate=False))
    gathered = {name: p.full_tensor() for name, p in params.items()}  # collectives first
    reference = dict(eager.named_parameters(remove_duplicate=False))
    assert params.keys() == reference.keys(), sorted(params.keys() ^ reference.keys())
    for name, param in params.items():
        ref = reference[name]
        assert isinstance(param, DTensor) and isinstance(param, nn.Parameter), name
        local = param.to_local()
        assert not torchdefer.is_fake(local), f"{name}: local shard still deferred"
        expected = _expected_shard(ref.detach(), rank, world)
        assert local.dtype == ref.dtype and local.shape == expected.shape, name
        assert torch.equal(local, expected), f"{name}: local shard differs from eager slice"
        assert torch.equal(gathered[name], ref), f"{name}: gathered tensor differs"
        assert param.requires_grad == ref.requires_grad, name
        # The shard owns at most its padded slice: no full parameter is kept.
        padded = _expected_shard(ref, 0, world).numel() * ref.element_size()
        assert local.untyped_storage().nbytes() <= padded, f"{name}: holds more than a shard"
    buffers = dict(model.named_buffers())
    for name, ref in eager.named_buffers():
        assert torch.equal(buffers[name], ref), f"buffer {name} differs"


def _fsdp2_parity(build: Callable[[], nn.Module], rank: int, world: int) -> nn.Module:
    eager, model = _build_both(build)
    _shard_fsdp2(model)
    tdd.materialize_module(model)
    _check_fsdp2_parity(eager, model, rank, world)
    return model


# ---- scenarios -----------------------------------------------------------------------


def _reset_peak_rss() -> None:
    """Reset the kernel's RSS high-water mark (VmHWM), so earlier work in this
    process (other tests when world size 1 runs in-process) does not count."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def fsdp2_peak_memory_is_shards_plus_one_parameter(rank: int, world: int) -> None:
    """Peak RSS while materializing: shards plus about one parameter."""
    n_layers, width = 16, 512
    param_bytes = width * width * 4  # fp32 weight; biases are small
    full_bytes = n_layers * (param_bytes + width * 4)
    model = torchdefer.deferred_init(
        lambda: nn.Sequential(*[nn.Linear(width, width) for _ in range(n_layers)])
    )
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    _reset_peak_rss()
    before = psutil.Process().memory_info().rss
    tdd.materialize_module(model)
    peak = _peak_rss() - before
    shards = sum(p.to_local().untyped_storage().nbytes() for p in model.parameters())
    bound = shards + 2 * param_bytes + (4 << 20)  # + slack for allocator bookkeeping
    assert peak < bound, (
        f"peak RSS increase {peak >> 20} MiB exceeds shards ({shards >> 20} MiB) + two "
        f"parameters ({2 * param_bytes >> 20} MiB); the full model is {full_bytes >> 20} MiB"
    )


def fsdp2_torch_nn_models_match_eager(rank: int, world: int) -> None:
    for build in TORCH_NN.values():
        _fsdp2_parity(build, rank, world)


def fsdp2_hf_models_match_eager(rank: int, world: int) -> None:
    for build in _hf_models().values():
        _fsdp2_parity(build, rank, world)


def fsdp2_training_step_matches_eager(rank: int, world: int) -> None:
    for name, build in [("mlp", _mlp), ("llama", _hf_models()["llama"])]:
        eager, model = _build_both(build)
        _shard_fsdp2(model)
        tdd.materialize_module(model)
        torch.manual_seed(1)
        x = torch.randint(0, 100, (2, 5)) if name == "llama" else torch.randn(4, 5)
        outs = []
        for m in (eager, model):
            optim = torch.optim.SGD(m.parameters(), lr=0.1)
            out = m(x).logits if name == "llama" else m(x)
            out.float().pow(2).mean().backward()
            optim.step()
            outs.append(out.detach())
        torch.testing.assert_close(outs[1], outs[0])
        stepped = {n: p.full_tensor() for n, p in model.named_parameters()}
        for n, ref in eager.named_parameters():
            torch.testing.assert_close(stepped[n], ref.detach(), msg=f"{name}.{n} after step")


def dtensor_placements_match_eager(rank: int, world: int) -> None:
    torch.manual_seed(3)
    eager = torch.randn(6, 10)
    torch.manual_seed(3)
    deferred = torchdefer.deferred_init(lambda: nn.Parameter(torch.randn(6, 10)))
    layouts = [((world,), [Shard(0)]), ((world,), [Shard(1)]), ((world,), [Replicate()])]
    if world == 4:
        layouts += [((2, 2), [Shard(0), Shard(1)]), ((2, 2), [Replicate(), Shard(0)])]
    for shape, placements in layouts:
        mesh = init_device_mesh("cpu", shape)
        ours = tdd.materialize_dtensor(deferred, mesh, placements)
        theirs = DTensor.from_local(eager, mesh, [Replicate()] * mesh.ndim).redistribute(
            mesh, placements
        )
        full = ours.full_tensor()
        assert isinstance(ours, nn.Parameter) and ours.requires_grad, placements
        assert torch.equal(ours.to_local(), theirs.to_local()), f"{placements}: local differs"
        assert torch.equal(full, eager), f"{placements}: full tensor differs"
        local = ours.to_local()
        assert local.untyped_storage().nbytes() == local.numel() * local.element_size()
    assert torchdefer.is_deferred(deferred), "the input stays deferred (nothing swapped)"


def tensor_parallel_module_matches_eager(rank: int, world: int) -> None:
    def build():
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))

    eager, model = _build_both(build)
    mesh = init_device_mesh("cpu", (world,))
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    parallelize_module(model, mesh, plan, src_data_rank=None)
    tdd.materialize_module(model)
    reference = parallelize_module(eager, mesh, plan)  # rank 0 scatters the eager weights
    theirs = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(param.to_local(), theirs[name].to_local()), name
    x = torch.randn(3, 4)
    torch.testing.assert_close(model(x), reference(x))


def tensor_parallel_default_src_data_rank_raises_with_the_fix(rank: int, world: int) -> None:
    """src_data_rank=0 (the default) would scatter data no rank has: every rank raises."""
    model = torchdefer.deferred_init(lambda: nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4)))
    mesh = init_device_mesh("cpu", (world,))
    try:
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    except RuntimeError as e:
        assert "src_data_rank=None" in str(e) and "scatter" in str(e), str(e)
    else:
        raise AssertionError("parallelize_module with src_data_rank=0 did not raise")


def _fsdp1_parity(build, policy, rank: int, world: int, init_fn) -> None:
    eager, model = _build_both(build)
    cpu = torch.device("cpu")
    with tdd.fsdp1_deferred_init():
        model = FSDP(model, auto_wrap_policy=policy, param_init_fn=init_fn, device_id=cpu)
    reference = FSDP(eager, auto_wrap_policy=policy, device_id=cpu)
    assert not torchdefer.is_deferred(model)
    ours = [m._handle.flat_param for m in FSDP.fsdp_modules(model) if m._handle]
    theirs = [m._handle.flat_param for m in FSDP.fsdp_modules(reference) if m._handle]
    assert len(ours) == len(theirs) > 1
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b), "local flat shard differs from FSDP1 on the eager model"
    with FSDP.summon_full_params(model), FSDP.summon_full_params(reference):
        full = dict(model.named_parameters())
        for name, ref in reference.named_parameters():
            assert torch.equal(full[name], ref), f"{name}: gathered parameter differs"


def fsdp1_param_init_fn_matches_eager(rank: int, world: int) -> None:
    policy = ModuleWrapPolicy({nn.TransformerEncoderLayer})
    _fsdp1_parity(_encoder, policy, rank, world, tdd.param_init_fn)
    _fsdp1_parity(_mlp, ModuleWrapPolicy({nn.Linear}), rank, world, tdd.param_init_fn)


def fsdp1_without_param_init_fn_matches_eager(rank: int, world: int) -> None:
    policy = ModuleWrapPolicy({nn.TransformerEncoderLayer})
    _fsdp1_parity(_encoder, policy, rank, world, None)


ALL = [
    "fsdp2_peak_memory_is_shards_plus_one_parameter",  # first: measures the RSS high-water mark
    "fsdp2_torch_nn_models_match_eager",
    "fsdp2_hf_models_match_eager",
    "fsdp2_training_step_matches_eager",
    "dtensor_placements_match_eager",
    "tensor_parallel_module_matches_eager",
    "tensor_parallel_default_src_data_rank_raises_with_the_fix",
    "fsdp1_param_init_fn_matches_eager",
    "fsdp1_without_param_init_fn_matches_eager",
]
