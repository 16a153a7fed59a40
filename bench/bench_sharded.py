"""Sharded materialization that scales: per-rank time and memory, pipeline stages, 70B on 64 ranks.

Cases, each in fresh processes (CPU, gloo, one thread per process):

* ``eager``: the model built eagerly once; a digest of every parameter's
  FSDP2 shard for each world size and rank (``torch.chunk`` on dim 0), and of
  every parameter (for the pipeline stage).
* ``fsdp W`` for W in ``--worlds``: W gloo ranks each build the deferred model
  from the same seed, ``fully_shard`` each decoder layer and the root, and
  materialize. The ranks take turns (a barrier between turns), so each has the
  machine to itself: wall time, CPU time and peak RSS over the baseline
  (``VmHWM``, reset first) are its own. Every local shard's digest is compared
  with eager's slice. ``--before`` also runs each world with
  ``TORCHDEFER_SHARD_ROWS=0`` (every shard through its full parameter: the
  path before row replay).
* ``whole``, ``stage``: the deferred model materialized whole with
  ``materialize_module``, and only the last of ``--stages`` pipeline stages
  made as torchtitan makes them (``copy.deepcopy`` of the model, the other
  stages' layers deleted, the embedding dropped).

The report (``results/sharded.md``, ``sharded.json``) gives the ratios of one
run, and extrapolates to Llama 3.1 70B on 8 and 64 ranks (method in the
report).

    python bench/bench_sharded.py [--layers 8 --hidden 4096 --intermediate 11008
        --heads 32 --kv-heads 32 --vocab 32000 --worlds 1 2 4 --stages 4 --before
        --out bench/results]
"""

from __future__ import annotations

import argparse
import copy
import gc
import hashlib
import json
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench.memory import PeakMeter

MiB = 1 << 20
LLAMA70B = dict(
    hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
    num_key_value_heads=8, vocab_size=128256,
)  # fmt: skip


def _config(shape: dict):
    import transformers

    return transformers.LlamaConfig(**shape, tie_word_embeddings=False)


def _build(shape: dict):
    import transformers

    return transformers.LlamaForCausalLM(_config(shape))


def _digest(t: torch.Tensor) -> str:
    t = t.detach().contiguous()
    raw = t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return hashlib.blake2b(memoryview(raw.reshape(-1).numpy()), digest_size=16).hexdigest()


_METER = PeakMeter()


def _reset_peak() -> int:
    return _METER.reset(collect=False)


def _peak() -> int:
    peak = _METER.peak()
    if peak is None:
        raise RuntimeError("no VmHWM")
    return peak


# ---------------------------------------------------------------- cases


def _eager(shape: dict, worlds: list[int], out: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    start = time.perf_counter()
    model = _build(shape)
    seconds = time.perf_counter() - start
    shards, whole = {}, {}
    for name, p in model.named_parameters():
        whole[name] = _digest(p)
        for world in worlds:
            chunks = torch.chunk(p.detach(), world, dim=0)
            for rank in range(world):
                part = chunks[rank] if rank < len(chunks) else p[:0]
                shards[f"{world}/{rank}/{name}"] = _digest(part)
    Path(out, "eager.json").write_text(json.dumps(dict(seconds=seconds, shards=shards,
                                                       whole=whole)))


def _fsdp_rank(
    rank: int, world: int, port: int, shape: dict, out: str, rows: bool, repeats: int
) -> None:
    if not rows:
        os.environ["TORCHDEFER_SHARD_ROWS"] = "0"
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    import torchdefer
    import torchdefer.distributed
    from torchdefer.distributed.shard import observe

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    runs = []
    for _ in range(repeats):
        model = None
        gc.collect()
        torch.manual_seed(0)
        model = torchdefer.deferred_init(_build, shape)
        largest = max(p.numel() * p.element_size() for p in model.parameters())
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        for turn in range(world):  # one rank at a time; the others wait in the barrier
            dist.barrier()
            if turn != rank:
                continue
            gc.collect()
            base = _reset_peak()
            wall, cpu = time.perf_counter(), time.process_time()
            with observe() as seen:
                torchdefer.distributed.materialize_module(model)
            runs.append(dict(
                wall=time.perf_counter() - wall, cpu=time.process_time() - cpu,
                peak=_peak() - base, rows=sum(s.rows for s in seen), params=len(seen),
                drawn=sum(s.drawn for s in seen),
                fallbacks=[s.reason for s in seen if not s.rows][:3],
            ))
        dist.barrier()
    params = dict(model.named_parameters())
    row = dict(
        runs[len(runs) // 2] if repeats % 2 else runs[-1],
        wall=_median([r["wall"] for r in runs]), cpu=_median([r["cpu"] for r in runs]),
        first=runs[0]["cpu"], walls=[r["wall"] for r in runs], cpus=[r["cpu"] for r in runs],
        peak=max(r["peak"] for r in runs),
        rank=rank, world=world, path="rows" if rows else "full", largest=largest,
        shards=sum(p.to_local().untyped_storage().nbytes() for p in params.values()),
        digests={n: _digest(p.to_local()) for n, p in params.items()},
    )
    Path(out, f"fsdp-{row['path']}-{world}-{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def stage_layers(stage: int, stages: int, layers: int) -> tuple[range, bool, bool]:
    """The layers of pipeline ``stage`` and whether it has the embedding and the head,
    as torchtitan's ``generate_llm_fqn_per_model_part`` splits with its default weights
    (the embedding and the norm + output head each count as one layer)."""
    effective = layers + 2
    per, extra = divmod(effective, stages)
    counts = [per + (1 if i < extra else 0) for i in range(stages)]
    counts[0] -= 1
    counts[-1] -= 1
    first = sum(counts[:stage])
    return range(first, min(layers, first + counts[stage])), stage == 0, stage == stages - 1


def split_stage(model, stage: int, stages: int):
    """Pipeline ``stage`` as torchtitan's ``pipeline_module_split`` builds it: a deep copy
    of the model, the other stages' layers dropped, unused ends set to None.

    Returns the stage and ``{stage parameter name: model parameter name}``.
    """
    from torch import nn

    keep, embedding, head = stage_layers(stage, stages, len(model.model.layers))
    part = copy.deepcopy(model)
    part.model.layers = nn.ModuleList([part.model.layers[i] for i in keep])
    if not embedding:
        part.model.embed_tokens = None
    if not head:
        part.model.norm = None
        part.lm_head = None
    names = {}
    for name, _ in part.named_parameters():
        original = name
        if name.startswith("model.layers."):
            _, _, index, rest = name.split(".", 3)
            original = f"model.layers.{keep[int(index)]}.{rest}"
        names[name] = original
    return part, names


def _pipeline(shape: dict, stages: int, which: str, repeats: int, out: str) -> None:
    import torchdefer

    torch.set_num_threads(1)
    runs = []
    for _ in range(repeats):
        target = model = None
        gc.collect()
        torch.manual_seed(0)
        model = torchdefer.deferred_init(_build, shape)
        target, names = model, {n: n for n, _ in model.named_parameters()}
        if which == "stage":
            target, names = split_stage(model, stages - 1, stages)
        gc.collect()
        base = _reset_peak()
        wall, cpu = time.perf_counter(), time.process_time()
        torchdefer.materialize_module(target)
        runs.append((time.perf_counter() - wall, time.process_time() - cpu, _peak() - base))
    digests = {names[n]: _digest(p) for n, p in target.named_parameters()}
    Path(out, f"{which}.json").write_text(json.dumps(dict(
        wall=_median([r[0] for r in runs]), cpu=_median([r[1] for r in runs]),
        walls=[r[0] for r in runs], cpus=[r[1] for r in runs], peak=max(r[2] for r in runs),
        params=sum(p.numel() for p in target.parameters()), digests=digests,
    )))


def _jumps(out: str) -> None:
    """The cost of one jump-ahead: cold (a new distance) and warm (a distance seen)."""
    from torchdefer.rng import _gf2 as gf2
    from torchdefer.rng import mt19937

    torch.set_num_threads(1)
    state = torch.Generator().manual_seed(1).get_state()
    gf2.reduce(1 << (2 * gf2.DEGREE - 2))
    result = {}
    for bits in (24, 28, 32):
        words = (1 << bits) + 12345
        start = time.perf_counter()
        mt19937.advance(state, words)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        mt19937.advance(state, words)
        result[bits] = dict(cold=cold, warm=time.perf_counter() - start)
    Path(out, "jumps.json").write_text(json.dumps(result))


# ---------------------------------------------------------------- driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _process(target, *args) -> None:
    process = mp.get_context("spawn").Process(target=target, args=args)
    process.start()
    process.join()
    if process.exitcode:
        raise SystemExit(f"{target.__name__}{args[:-1]} failed with exit code {process.exitcode}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Llama 2 7B's shapes, 8 of its 32 layers (1.9B parameters, 7.5 GB in fp32).
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=11008)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--before", action="store_true", help="also time the full-replay path")
    parser.add_argument("--repeats", type=int, default=3, help="runs per rank (median)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    shape = dict(
        num_hidden_layers=args.layers, hidden_size=args.hidden,
        intermediate_size=args.intermediate, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
    )  # fmt: skip
    # glibc's default allocator, as users run. (MALLOC_MMAP_THRESHOLD_=65536, which the
    # memory benchmarks set, makes every jump-ahead page-fault its ~25 MB of temporaries.)
    os.environ["OMP_NUM_THREADS"] = "1"
    tmp = tempfile.mkdtemp()
    load = [os.getloadavg()]
    _process(_eager, shape, args.worlds, tmp)
    _process(_jumps, tmp)
    for rows in [True, False] if args.before else [True]:
        repeats = args.repeats if rows else 1  # the path before: one run, for scale
        for world in args.worlds:
            mp.spawn(_fsdp_rank, args=(world, _free_port(), shape, tmp, rows, repeats),
                     nprocs=world)
    for which in ("whole", "stage"):
        _process(_pipeline, shape, args.stages, which, args.repeats, tmp)
    load.append(os.getloadavg())
    results = _collect(Path(tmp), args, shape, load)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sharded.json").write_text(json.dumps(results, indent=1))
    from bench.sharded_report import report

    text = report(results)
    (args.out / "sharded.md").write_text(text)
    print(text)


def _collect(tmp: Path, args, shape: dict, load) -> dict:
    eager = json.loads((tmp / "eager.json").read_text())
    fsdp = []
    for path in sorted(tmp.glob("fsdp-*.json")):
        row = json.loads(path.read_text())
        digests = row.pop("digests")
        prefix = f"{row['world']}/{row['rank']}/"
        row["bitwise"] = all(eager["shards"][prefix + n] == d for n, d in digests.items())
        fsdp.append(row)
    pipeline = {}
    for which in ("whole", "stage"):
        row = json.loads((tmp / f"{which}.json").read_text())
        digests = row.pop("digests")
        row["bitwise"] = all(eager["whole"][n] == d for n, d in digests.items())
        pipeline[which] = row
    return dict(
        command=" ".join(["python", *sys.argv]), shape=shape, stages=args.stages,
        repeats=args.repeats,
        eager_seconds=eager["seconds"], fsdp=fsdp, pipeline=pipeline,
        jumps=json.loads((tmp / "jumps.json").read_text()), load=load,
        machine=f"{platform.machine()}, {psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / (1 << 30):.0f} GiB, torch {torch.__version__}, "
        f"python {sys.version.split()[0]}",
        scale=_counts(shape),
    )


def _counts(shape: dict) -> dict:
    """Parameters and elements of the benchmarked model and of Llama 3.1 70B (meta device)."""
    out = {}
    for name, s in (("model", shape), ("70b", LLAMA70B)):
        with torch.device("meta"):
            model = _build(s)
        params = list(model.parameters())
        out[name] = dict(params=len(params), elements=sum(p.numel() for p in params))
    return out


if __name__ == "__main__":
    main()
