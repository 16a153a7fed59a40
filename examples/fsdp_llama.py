"""Build a Llama without allocating it, shard it with FSDP2, materialize only the shards.

Run (CPU, gloo)::     torchrun --nproc-per-node 2 examples/fsdp_llama.py
Run (GPUs, nccl)::    torchrun --nproc-per-node 2 examples/fsdp_llama.py

The backend follows the hardware (nccl with a GPU per rank, gloo without). Each rank
builds the same deferred model from the same seed, applies ``fully_shard`` to
every decoder layer and the root as for a meta-device model, then
``torchdefer.distributed.materialize_module`` makes each rank's shards: on the
CPU from the rank's own rows (no full parameter is allocated), on CUDA by
building one full parameter at a time and keeping the slice. Every rank prints
the memory it used, then checks its
shards against the model built eagerly (``--no-check`` skips that, for models
too big to build eagerly), and runs a forward, backward and optimizer step.

Where full parameters are built (CUDA, or an init that mixes elements), glibc
may keep them mapped after they are freed, which inflates the RSS printed;
``MALLOC_MMAP_THRESHOLD_=65536 torchrun ...`` makes RSS follow frees
(bench/bench_fsdp_memory.py does that).

Options: ``--layers N --hidden H --vocab V`` (defaults: a ~45M-parameter model).
"""

from __future__ import annotations

import argparse
import os
import resource

import psutil
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import torchdefer
import torchdefer.distributed

MiB = 1 << 20


def llama_config(layers: int, hidden: int, vocab: int):
    try:
        import transformers
    except ImportError as e:  # optional dependency
        raise SystemExit("This example needs transformers: pip install transformers") from e
    return transformers.LlamaConfig(
        num_hidden_layers=layers, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
        num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
        vocab_size=vocab, tie_word_embeddings=False,
    )


def build(config):
    import transformers

    return transformers.LlamaForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip building the eager model to compare shards with")
    args = parser.parse_args()

    # One GPU per rank, or CPU ranks (gloo) where this host has fewer GPUs than ranks.
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_ranks
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else None
    if cuda:
        torch.cuda.set_device(device)
    config = llama_config(args.layers, args.hidden, args.vocab)

    torch.manual_seed(0)  # the same seed on every rank: the same global model
    with torch.device(device or "cpu"):
        model = torchdefer.deferred_init(build, config)
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    # FSDP2's default mesh is CUDA's wherever CUDA exists: name the ranks' device.
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    rss_before = psutil.Process().memory_info().rss
    torchdefer.distributed.materialize_module(model)
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    shard_bytes = sum(p.to_local().untyped_storage().nbytes() for p in model.parameters())
    line = (
        f"rank {rank}/{world}: model {full_bytes / MiB:.1f} MiB, largest parameter "
        f"{largest / MiB:.1f} MiB, local shards {shard_bytes / MiB:.1f} MiB, "
        f"peak RSS increase while materializing <= {(rss_peak - rss_before) / MiB:.1f} MiB"
    )
    if cuda:
        line += f", peak CUDA memory {torch.cuda.max_memory_allocated(device) / MiB:.1f} MiB"
    print(line, flush=True)

    if args.check:
        check_against_eager(model, config, rank, world, device)
    ids = torch.randint(0, config.vocab_size, (2, 16), device=device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.optim.AdamW(model.parameters(), lr=1e-4).step()
    if rank == 0:
        print(f"forward, backward and an optimizer step ran: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


def check_against_eager(model, config, rank: int, world: int, device) -> None:
    """Every local shard equals the matching slice of the eagerly built model, bit for bit."""
    torch.manual_seed(0)
    with torch.device(device or "cpu"):  # the same device, hence the same generator
        eager = build(config)
    reference = dict(eager.named_parameters())
    for name, param in model.named_parameters():
        expected = torch.chunk(reference[name].detach(), world, dim=0)
        expected = expected[rank] if rank < len(expected) else expected[0][:0]
        if not torch.equal(param.to_local(), expected):
            raise SystemExit(f"rank {rank}: shard of {name} differs from the eager model")
    print(f"rank {rank}: all {len(reference)} local shards equal the eager model's slices")


if __name__ == "__main__":
    main()
