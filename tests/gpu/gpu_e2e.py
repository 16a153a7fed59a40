"""End-to-end checks on a real GPU: eager vs deferred, bit for bit, in every order.

Each check builds the same program eagerly and deferred from the same seed
and compares every tensor bitwise (small MLPs, a transformer layer, one of
every counted random op, a torchtitan-style Llama and Hugging Face's Llama):
materialized all at once, one at a time in reverse, only the last one, recorded on the CPU and materialized on CUDA (the
values the same code gives run with ``device="cuda"``), recorded on CUDA and
materialized on the CPU, and sharded by FSDP2 on a one-GPU group. It also
checks the CUDA generator after ``deferred_init`` (where eager leaves it) and
after materialization (untouched), and that 2**30 CUDA normals per dtype stay
within the limit ``rng._bounds`` takes from the kernels' source. Used by ``gpu_probe.py`` and
``test_gpu_parity.py``; needs CUDA.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import torchdefer

Check = tuple[str, bool, str]  # (name, passed, detail)


def mlp(device: Any) -> nn.Module:
    return nn.Sequential(nn.Linear(300, 200, device=device), nn.GELU(),
                         nn.Linear(200, 5, device=device), nn.LayerNorm(5, device=device))


def encoder(device: Any) -> nn.Module:
    return nn.TransformerEncoderLayer(64, 4, 128, device=device, batch_first=True)


def draws(device: Any) -> tuple[torch.Tensor, ...]:
    """One of every counted row, with sizes past a grid, complex, strided and 0-d outputs."""
    big = 8 * 132 * 8 * 256 + 1
    wide = torch.empty(40, 30, device=device).t()[::2].normal_()
    ints = torch.empty(1000, dtype=torch.float32, device=device).random_(0, None)
    return (
        torch.randn(big, device=device),
        torch.rand(1001, dtype=torch.complex64, device=device),
        torch.randn(77, dtype=torch.float64, device=device),
        wide,
        ints,
        torch.empty(0, device=device).uniform_(),
        torch.empty((), device=device).exponential_(),
        torch.empty(500, dtype=torch.bool, device=device).bernoulli_(0.3),
        torch.randint(0, 1 << 30, (999,), device=device),
        torch.empty(64, 3, dtype=torch.int64, device=device).random_(),
        nn.init.trunc_normal_(torch.empty(33, 7, device=device), std=0.02),
        torch.empty(9, device=device).bernoulli_(torch.full((9,), 0.5, device=device)),
    )


def reseeded(device: Any) -> tuple[torch.Tensor, ...]:
    """Two epochs: a reseed inside the recording (each device's generator reseeded)."""
    a = torch.randn(1000, device=device)
    torch.manual_seed(5)
    return a, torch.rand(3000, device=device), torch.randn(10, device=device)


def forked(device: Any) -> tuple[torch.Tensor, ...]:
    """Draws inside fork_rng (restored after it, on every device it forks)."""
    where = torch.device(device)
    devices = [where.index or 0] if where.type == "cuda" else []
    a = torch.randn(100, device=device)
    with torch.random.fork_rng(devices=devices):
        b = torch.rand(5000, device=device)
    return a, b, torch.randn(100, device=device)


def titan(device: Any) -> nn.Module:
    """A small Llama with torchtitan 0.3's init (trunc_normal_, 3-sigma output layer)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from titan_model import TitanArgs, TitanLlama

    args = TitanArgs(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, hidden=512, vocab=1000,
                     max_seq_len=64)
    with torch.device(device):
        return TitanLlama(args)


def hf_llama(device: Any) -> nn.Module:
    """Hugging Face's Llama from a config (nothing downloaded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    with torch.device(device):
        return LlamaForCausalLM(config)


BUILDS: dict[str, Callable[[Any], Any]] = {
    "mlp": mlp, "encoder": encoder, "draws": draws, "reseeded": reseeded, "forked": forked,
    "titan": titan, "hf_llama": hf_llama,
}


def tensors_of(built: Any) -> list[torch.Tensor]:
    if isinstance(built, nn.Module):
        return [*built.parameters(), *built.buffers()]
    return list(built)


def _same(got: list[torch.Tensor], expected: list[torch.Tensor]) -> str:
    """'' when equal bit for bit, else what differs."""
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        if a.device != b.device or a.dtype != b.dtype or a.shape != b.shape:
            return f"tensor {i}: {a.dtype} {tuple(a.shape)} on {a.device} vs {b.dtype} on {b.device}"
        if not torch.equal(_bits(a), _bits(b)):
            return f"tensor {i} ({tuple(a.shape)}, {a.dtype}) differs"
    return ""


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def _eager(build, device, seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    torch.manual_seed(seed)
    out = tensors_of(build(device))
    return [t.detach().clone() for t in out], torch.cuda.get_rng_state()


def _deferred(build, device, seed: int = 0):
    torch.manual_seed(seed)
    built = torchdefer.deferred_init(build, device)
    return built, torch.cuda.get_rng_state()


def _materialize(built, order: str, device=None) -> list[torch.Tensor]:
    tensors = tensors_of(built)
    picks = {"full": range(len(tensors)), "reverse": range(len(tensors) - 1, -1, -1),
             "partial": [len(tensors) - 1]}[order]
    out: dict[int, torch.Tensor] = {}
    for i in picks:
        out[i] = torchdefer.materialize_tensor(tensors[i], device=device)
    return [out[i] for i in sorted(out)]


def check_build(name: str, build, device: torch.device) -> list[Check]:
    results = []
    expected, eager_state = _eager(build, device)
    for order in ("full", "reverse", "partial"):
        built, state = _deferred(build, device)
        same_state = torch.equal(state, eager_state)
        results.append((f"{name}: CUDA RNG state after deferred_init", same_state, ""))
        before = torch.cuda.get_rng_state()
        got = _materialize(built, order)
        want = expected if order != "partial" else expected[-1:]
        diff = _same(got, want)
        results.append((f"{name}: eager vs deferred, {order}", not diff, diff))
        moved = not torch.equal(before, torch.cuda.get_rng_state())
        results.append((f"{name}: materialization leaves the CUDA generator", not moved, ""))
    # Recorded on the CPU, materialized on CUDA: the same code run with device="cuda".
    built, _ = _deferred(build, "cpu")
    diff = _same(_materialize(built, "reverse", device), expected)
    results.append((f"{name}: recorded on cpu, materialized on cuda", not diff, diff))
    # Recorded on CUDA, materialized on the CPU: the same code run with device="cpu".
    torch.manual_seed(0)
    on_cpu = [t.detach().clone() for t in tensors_of(build("cpu"))]
    built, _ = _deferred(build, device)
    diff = _same(_materialize(built, "reverse", "cpu"), on_cpu)
    results.append((f"{name}: recorded on cuda, materialized on cpu", not diff, diff))
    return results


def check_fsdp2(device: torch.device) -> list[Check]:
    """One-GPU FSDP2: shards made by torchdefer.distributed equal eager's parameters."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    import torchdefer.distributed as tdd

    if not dist.is_available() or not dist.is_nccl_available():
        return [("fsdp2 on one GPU", False, "torch.distributed with NCCL is not available")]
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        eager = mlp(device)
        torch.manual_seed(0)
        model = torchdefer.deferred_init(mlp, device)
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        tdd.materialize_module(model)
        got = [p.full_tensor() for p in model.parameters()]
        diff = _same(got, [p.detach() for p in eager.parameters()])
        return [("mlp: FSDP2 shards on one GPU", not diff, diff)]
    finally:
        dist.destroy_process_group()


def check_normal_limit(device: torch.device) -> list[Check]:
    """CUDA normals never pass the |z| limit that proves trunc_normal_ draws once.

    An empirical bound only (2**30 draws reach about 6.1 sigma, the float
    limit is 6.76): it catches a kernel whose uniforms are coarser than the
    source read says, not one that is off in the last digits.
    """
    from torchdefer.rng import _bounds as bounds

    results = []
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        # The CUDA kernels' limit alone: normal_limit is None where the CPU
        # kernels' premises fail on this torch (bfloat16 and float16 on 2.11).
        limit = bounds.cuda_limit(dtype) * (1 + bounds.RELATIVE_MARGIN)
        g = torch.Generator(device=device).manual_seed(7)
        peak = torch.empty(1 << 30, dtype=dtype, device=device).normal_(generator=g).abs().max()
        peak = float(peak)
        ok = peak <= limit
        results.append((f"normal_ {dtype}: max |z| {peak:.3f} within the proven limit {limit:.3f}",
                        ok, ""))
    return results


def run_all(device: torch.device) -> list[Check]:
    results: list[Check] = []
    try:
        results.extend(check_normal_limit(device))
    except Exception as e:
        results.append(("normal limit: raised", False, f"{type(e).__name__}: {e}"[:300]))
    for name, build in BUILDS.items():
        try:
            results.extend(check_build(name, build, device))
        except Exception as e:  # a crash is a failed check, reported with the others
            results.append((f"{name}: raised", False, f"{type(e).__name__}: {e}"[:300]))
    try:
        results.extend(check_fsdp2(device))
    except Exception as e:
        results.append(("fsdp2: raised", False, f"{type(e).__name__}: {e}"[:300]))
    return results
