"""FSDP2 materialization of the torchtitan-init Llama: per-rank time, path and peak memory.

W gloo ranks (CPU, one thread each) build ``bench/titan_model.py``'s model
deferred from one seed, ``fully_shard`` every block and the root, and
materialize, one rank at a time (a barrier between turns, so each has the
machine to itself). Per rank: wall and CPU time (median of ``--repeats``),
the CPU time split into user and system time (on the shared VMs measured the
rank that goes last in the first repeat pays up to 1 s more system time for
the same page faults: the kernel's, not the work's), the peak RSS over its
baseline, its shards' bytes, the largest parameter, and
``shard.observe()``'s path for every parameter; every local shard is compared
bit for bit with the slice of the eagerly built parameter.

    python bench/titan_fsdp.py [--small 4,1024,2816] [--vocab 32000] [--worlds 1 4]

Results: ``results/titan_fsdp.md`` and ``titan_fsdp.json``, with the command.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench.bench_sharded import _digest, _free_port, _median, _peak, _process, _reset_peak
from bench.titan_model import LLAMA3_8B, TitanArgs, TitanLlama

MiB = 1 << 20


def _eager(args: dict, worlds: list[int], out: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TitanLlama(TitanArgs(**args))
    shards = {}
    for name, p in model.named_parameters():
        for world in worlds:
            chunks = torch.chunk(p.detach(), world, dim=0)
            for rank in range(world):
                part = chunks[rank] if rank < len(chunks) else p[:0]
                shards[f"{world}/{rank}/{name}"] = _digest(part)
    Path(out, "eager.json").write_text(json.dumps(shards))


def _rank(rank: int, world: int, port: int, args: dict, out: str, repeats: int) -> None:
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
        model = torchdefer.deferred_init(TitanLlama, TitanArgs(**args))
        largest = max(p.numel() * p.element_size() for p in model.parameters())
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
        for layer in model.layers.values():
            fully_shard(layer)
        fully_shard(model)
        for turn in range(world):
            dist.barrier()
            if turn != rank:
                continue
            gc.collect()
            base = _reset_peak()
            wall, cpu = time.perf_counter(), time.process_time()
            usage = resource.getrusage(resource.RUSAGE_SELF)
            with observe() as seen:
                torchdefer.distributed.materialize_module(model)
            after = resource.getrusage(resource.RUSAGE_SELF)
            runs.append(dict(
                wall=time.perf_counter() - wall, cpu=time.process_time() - cpu,
                user=after.ru_utime - usage.ru_utime, sys=after.ru_stime - usage.ru_stime,
                peak=_peak() - base,
                paths={s.name: ("rows" if s.rows else f"full: {s.reason}") for s in seen},
            ))  # fmt: skip
        dist.barrier()
    params = dict(model.named_parameters())
    row = dict(
        rank=rank, world=world, largest=largest, buffers=buffers,
        wall=_median([r["wall"] for r in runs]), cpu=_median([r["cpu"] for r in runs]),
        user=_median([r["user"] for r in runs]), sys=_median([r["sys"] for r in runs]),
        cpus=[round(r["cpu"], 3) for r in runs],
        peak=max(r["peak"] for r in runs), paths=runs[-1]["paths"],
        shards=sum(p.to_local().untyped_storage().nbytes() for p in params.values()),
        digests={n: _digest(p.to_local()) for n, p in params.items()},
    )  # fmt: skip
    Path(out, f"rank-{world}-{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", default="4,1024,2816", help="layers,dim,hidden")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 4])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    o = p.parse_args()
    layers, dim, hidden = (int(x) for x in o.small.split(","))
    args = asdict(replace(LLAMA3_8B, n_layers=layers, dim=dim, hidden=hidden, vocab=o.vocab,
                          n_heads=dim // 128, n_kv_heads=max(1, dim // 512)))  # fmt: skip
    os.environ["OMP_NUM_THREADS"] = "1"
    tmp = tempfile.mkdtemp()
    _process(_eager, args, o.worlds, tmp)
    for world in o.worlds:
        mp.spawn(_rank, args=(world, _free_port(), args, tmp, o.repeats), nprocs=world)
    eager = json.loads(Path(tmp, "eager.json").read_text())
    rows = []
    for world in o.worlds:
        for rank in range(world):
            row = json.loads(Path(tmp, f"rank-{world}-{rank}.json").read_text())
            digests = row.pop("digests")
            row["bitwise"] = all(eager[f"{world}/{rank}/{n}"] == d for n, d in digests.items())
            rows.append(row)
    command = (f"nice -n 10 python bench/titan_fsdp.py --small {o.small} --vocab {o.vocab} "
               f"--worlds {' '.join(map(str, o.worlds))} --repeats {o.repeats}")  # fmt: skip
    text = _report(rows, o, args, command)
    o.out.mkdir(parents=True, exist_ok=True)
    (o.out / "titan_fsdp.json").write_text(json.dumps(dict(command=command, rows=rows), indent=1))
    (o.out / "titan_fsdp.md").write_text(text)
    print(text)


def _report(rows: list[dict], o, args: dict, command: str) -> str:
    one = next(r for r in rows if r["world"] == 1)
    lines = [
        "# FSDP2 materialization of the torchtitan-init Llama (`bench/titan_fsdp.py`)",
        "",
        f"{args['n_layers']} layers, dim {args['dim']}, hidden {args['hidden']}, vocab "
        f"{args['vocab']}, 3-sigma output; torch {torch.__version__}; gloo on the CPU, one "
        f"thread per rank, ranks take turns; medians of {o.repeats}. Command: `{command}`",
        "",
        "| world | rank | CPU s | CPU / one rank (<= 0.35 at 4) | user s | user / one rank | "
        "system s | wall s | peak MiB | shards + buffers + largest MiB | peak <= that | "
        "rows / params | bitwise |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        bound = r["shards"] + r["buffers"] + r["largest"]
        on_rows = sum(v == "rows" for v in r["paths"].values())
        lines.append(
            f"| {r['world']} | {r['rank']} | {r['cpu']:.2f} | {r['cpu'] / one['cpu']:.2f} | "
            f"{r['user']:.2f} | {r['user'] / one['user']:.2f} | {r['sys']:.2f} | "
            f"{r['wall']:.2f} | {r['peak'] / MiB:.0f} | {bound / MiB:.0f} | "
            f"{r['peak'] <= bound} | {on_rows} / {len(r['paths'])} | {r['bitwise']} |"
        )
    full = sorted({f"{n} ({v})" for r in rows for n, v in r["paths"].items() if v != "rows"})
    lines += ["", "Parameters not on the row path: " + (", ".join(full) or "none") + "."]
    each = "; ".join(
        f"{r['world']}/{r['rank']}: {', '.join(f'{c:.2f}' for c in r['cpus'])}" for r in rows)
    lines += ["", f"CPU seconds of each repeat (world/rank): {each}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
