"""Per-rank peak memory of sharded materialization (FSDP2) vs the full model size.

For each world size, spawns that many CPU ranks (gloo); each builds a deferred
Llama-shaped model from the same seed, applies ``fully_shard`` per decoder
layer and to the root, and runs ``torchdefer.distributed.materialize_module``.
Measured per rank:

- ``peak``: the process's RSS high-water mark (``ru_maxrss``) minus its RSS
  just before materializing: an upper bound on the memory materialization
  took. glibc is told to serve large blocks by mmap
  (``MALLOC_MMAP_THRESHOLD_``), so freed full parameters leave RSS at once.
- ``sampled``: the highest RSS a 1 ms psutil sampler saw, minus the same base
  (a cross-check; it can miss short peaks).

and compared with the expected ``local shards + largest parameter`` and the
full model. The eager reference row builds the model eagerly on one process.

Run:  python bench/bench_fsdp_memory.py [--layers 8 --hidden 1024 --vocab 32000]
Writes bench/results/fsdp_memory.md (and prints it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench.models import llama_for_causal_lm as build

MiB = 1 << 20
RESULTS = Path(__file__).parent / "results" / "fsdp_memory.md"


class RssSampler:
    """Highest RSS seen by a background thread polling every millisecond."""

    def __init__(self) -> None:
        self.peak = psutil.Process().memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        process = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, process.memory_info().rss)
            time.sleep(0.001)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _rank(rank: int, world: int, port: int, shape: tuple[int, int, int], out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    import torchdefer
    import torchdefer.distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(build, *shape)
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    base = psutil.Process().memory_info().rss
    start = time.perf_counter()
    with RssSampler() as sampler:
        torchdefer.distributed.materialize_module(model)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    shards = sum(p.to_local().untyped_storage().nbytes() for p in model.parameters())
    shards += sum(b.untyped_storage().nbytes() for b in model.buffers())
    row = dict(rank=rank, world=world, full=full, largest=largest, shards=shards,
               peak=peak, sampled=sampler.peak - base, seconds=seconds)
    Path(out, f"{world}-{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


def _eager(shape: tuple[int, int, int], out: str) -> None:
    base = psutil.Process().memory_info().rss
    with RssSampler() as sampler:
        torch.manual_seed(0)
        model = build(*shape)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    Path(out, "eager.json").write_text(json.dumps(dict(full=full, peak=peak,
                                                       sampled=sampler.peak - base)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    shape = (args.layers, args.hidden, args.vocab)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by each spawned process at start
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = tempfile.mkdtemp()
    ctx = mp.get_context("spawn")
    eager = ctx.Process(target=_eager, args=(shape, out))
    eager.start()
    eager.join()
    for world in args.worlds:
        mp.spawn(_rank, args=(world, _free_port(), shape, out), nprocs=world)
    rows = [json.loads(Path(out, f"{w}-{r}.json").read_text())
            for w in args.worlds for r in range(w)]
    report = _report(json.loads(Path(out, "eager.json").read_text()), rows, shape)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    print(report)


def _report(eager: dict, rows: list[dict], shape: tuple[int, int, int]) -> str:
    layers, hidden, vocab = shape
    full = rows[0]["full"]
    lines = [
        "# Per-rank peak memory of FSDP2 sharded materialization",
        "",
        f"Llama-shaped model (transformers), {layers} layers, hidden {hidden}, vocab {vocab}: "
        f"{full / MiB:.1f} MiB of fp32 parameters, largest parameter "
        f"{rows[0]['largest'] / MiB:.1f} MiB. CPU, gloo, torch {torch.__version__}, "
        f"{platform.machine()}, {psutil.cpu_count()} cores, python {sys.version.split()[0]}.",
        "",
        "`peak` is an upper bound (RSS high-water mark minus RSS before materializing); "
        "`sampled` is the highest RSS seen by a 1 ms sampler. `bound` is local shards + the "
        "largest parameter: the most a rank needs when parameters are built whole and "
        "sliced (the fallback path). Every parameter of this model comes from the rank's "
        "own rows (`distributed/_rows.py`), so the peak is the shards. The ranks of a world "
        "run at once on this machine's cores: their times are not per-rank costs (see "
        "`bench/bench_sharded.py` for those). Produced by "
        "`python bench/bench_fsdp_memory.py`.",
        "",
        "| setup | rank | local shards + buffers (MiB) | bound (MiB) | peak (MiB) "
        "| sampled (MiB) | peak / full model | time (s) |",
        "|---|---|---|---|---|---|---|---|",
        f"| eager, 1 process | 0 | {eager['full'] / MiB:.1f} | {eager['full'] / MiB:.1f} | "
        f"{eager['peak'] / MiB:.1f} | {eager['sampled'] / MiB:.1f} | "
        f"{eager['peak'] / eager['full']:.2f} | - |",
    ]
    for row in rows:
        expected = row["shards"] + row["largest"]
        lines.append(
            f"| deferred + fully_shard, {row['world']} ranks | {row['rank']} | "
            f"{row['shards'] / MiB:.1f} | {expected / MiB:.1f} | {row['peak'] / MiB:.1f} | "
            f"{row['sampled'] / MiB:.1f} | {row['peak'] / row['full']:.2f} | "
            f"{row['seconds']:.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
