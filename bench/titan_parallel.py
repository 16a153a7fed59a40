"""HSDP, TP and TP+FSDP2 materialization of the torchtitan-init Llama: per-rank peak memory.

The companion of ``titan_fsdp.py`` (FSDP2 alone) for the other parallelisms
torchtitan composes, on W gloo ranks (CPU, one thread each):

* ``fsdp``: ``fully_shard`` every block and the root on a 1-D mesh (the reference);
* ``hsdp``: the same on a ``(W/2, 2)`` mesh (``("replicate", "shard")``);
* ``tp``: torchtitan's tensor-parallel plan on a 1-D mesh: ``wq``/``wk``/``wv``/``w1``/``w3``
  and the output head ``ColwiseParallel`` (``Shard(0)``: rows), ``wo``/``w2``
  ``RowwiseParallel`` (``Shard(1)``: columns), the embedding ``RowwiseParallel``
  (``Shard(0)`` of its table), norms replicated;
* ``tp+fsdp``: that plan on the ``"tp"`` dimension of a ``(W/2, 2)`` mesh, then
  ``fully_shard`` on its ``"dp"`` dimension.

Each rank builds the model deferred from one seed, applies the layout and
materializes, one rank at a time (a barrier between turns, so each has the
machine to itself). Per rank: wall and CPU time, the peak RSS over its
baseline, its bound (its local tensors + buffers + the largest parameter) and
``shard.observe()``'s path for every parameter. Then every parameter is
gathered (``full_tensor()``) and compared bit for bit with the eagerly built one.

    python bench/titan_parallel.py [--small 8,2048,5632] [--layouts hsdp tp tp+fsdp]

Results: ``results/titan_parallel.md`` and ``titan_parallel.json``, with the command.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench.bench_sharded import _digest, _free_port, _peak, _process, _reset_peak
from bench.titan_model import LLAMA3_8B, TitanArgs, TitanLlama

MiB = 1 << 20
LAYOUTS = ("fsdp", "hsdp", "tp", "tp+fsdp")


def _eager(args: dict, out: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TitanLlama(TitanArgs(**args))
    digests = {n: _digest(p) for n, p in model.named_parameters()}
    Path(out, "eager.json").write_text(json.dumps(digests))


def tp_plan(block) -> dict:
    """torchtitan's ``apply_tp`` plan for one block (without the sequence-parallel norms)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    del block
    colwise, rowwise = ColwiseParallel(), RowwiseParallel()
    return {
        "attention.wq": colwise, "attention.wk": colwise, "attention.wv": colwise,
        "attention.wo": rowwise,
        "feed_forward.w1": colwise, "feed_forward.w3": colwise, "feed_forward.w2": rowwise,
    }  # fmt: skip


def apply_layout(model, layout: str, world: int) -> None:
    """Shard ``model`` (deferred) as ``layout`` says, recording the slicing."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if layout in ("fsdp", "tp"):
        mesh = init_device_mesh("cpu", (world,))
    else:
        names = ("replicate", "shard") if layout == "hsdp" else ("dp", "tp")
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=names)
    if layout in ("tp", "tp+fsdp"):
        tp = mesh if layout == "tp" else mesh["tp"]
        parallelize_module(model, tp, {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(),
        }, src_data_rank=None)  # fmt: skip
        for block in model.layers.values():
            parallelize_module(block, tp, tp_plan(block), src_data_rank=None)
    if layout in ("fsdp", "hsdp", "tp+fsdp"):
        dp = mesh if layout != "tp+fsdp" else mesh["dp"]
        for block in model.layers.values():
            fully_shard(block, mesh=dp)
        fully_shard(model, mesh=dp)


def _rank(rank: int, world: int, port: int, layout: str, args: dict, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    import torchdefer
    import torchdefer.distributed
    from torchdefer.distributed.shard import observe

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(TitanLlama, TitanArgs(**args))
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    apply_layout(model, layout, world)
    row: dict = {}
    for turn in range(world):
        dist.barrier()
        if turn != rank:
            continue
        gc.collect()
        base = _reset_peak()
        wall, cpu = time.perf_counter(), time.process_time()
        with observe() as seen:
            torchdefer.distributed.materialize_module(model)
        row = dict(
            wall=time.perf_counter() - wall, cpu=time.process_time() - cpu, peak=_peak() - base,
            paths={s.name: _path(s) for s in seen},
        )  # fmt: skip
    dist.barrier()
    local = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
    row.update(rank=rank, world=world, layout=layout, largest=largest, buffers=buffers,
               shards=sum(t.untyped_storage().nbytes() for t in local))  # fmt: skip
    digests = {}
    for name, p in model.named_parameters():  # one gathered parameter at a time
        full = p.full_tensor() if isinstance(p, DTensor) else p
        digests[name] = _digest(full)
        del full
    row["digests"] = digests
    Path(out, f"{layout}-{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


def _path(seen) -> str:
    if not seen.rows:
        return f"full: {seen.reason}"
    return "row chunks" if getattr(seen, "chunked", False) else "rows"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", default="8,2048,5632", help="layers,dim,hidden")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--eager", type=Path, help="the eager digests of an earlier run (same args)")
    o = p.parse_args()
    layers, dim, hidden = (int(x) for x in o.small.split(","))
    args = asdict(replace(LLAMA3_8B, n_layers=layers, dim=dim, hidden=hidden, vocab=o.vocab,
                          n_heads=dim // 128, n_kv_heads=max(1, dim // 512)))  # fmt: skip
    os.environ["OMP_NUM_THREADS"] = "1"
    tmp = tempfile.mkdtemp()
    if o.eager is None:
        _process(_eager, args, tmp)
    else:  # the eager model takes minutes on two cores; its digests do not change
        Path(tmp, "eager.json").write_text(o.eager.read_text())
    eager = json.loads(Path(tmp, "eager.json").read_text())
    Path(o.out).mkdir(parents=True, exist_ok=True)
    Path(o.out, "titan_parallel_eager.json").write_text(json.dumps(eager))
    rows = []
    for layout in o.layouts:
        mp.spawn(_rank, args=(o.world, _free_port(), layout, args, tmp), nprocs=o.world)
        for rank in range(o.world):
            row = json.loads(Path(tmp, f"{layout}-{rank}.json").read_text())
            digests = row.pop("digests")
            row["bitwise"] = digests == eager
            rows.append(row)
    command = (f"nice -n 10 python bench/titan_parallel.py --small {o.small} --vocab {o.vocab} "
               f"--world {o.world} --layouts {' '.join(o.layouts)}")  # fmt: skip
    text = _report(rows, args, command)
    o.out.mkdir(parents=True, exist_ok=True)
    (o.out / "titan_parallel.json").write_text(json.dumps(dict(command=command, rows=rows),
                                                          indent=1))  # fmt: skip
    (o.out / "titan_parallel.md").write_text(text)
    print(text)


def _report(rows: list[dict], args: dict, command: str) -> str:
    lines = [
        "# HSDP, TP and TP+FSDP2 materialization of the torchtitan-init Llama "
        "(`bench/titan_parallel.py`)",
        "",
        f"{args['n_layers']} layers, dim {args['dim']}, hidden {args['hidden']}, vocab "
        f"{args['vocab']}, 3-sigma output; torch {torch.__version__}; gloo on the CPU, one "
        "thread per rank, ranks take turns. `bitwise`: every parameter gathered with "
        f"`full_tensor()` equals the eager one. Command: `{command}`",
        "",
        "| layout | rank | CPU s | wall s | peak MiB | local + buffers + largest MiB | "
        "peak <= that | rows / row chunks / full | bitwise |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        bound = r["shards"] + r["buffers"] + r["largest"]
        paths = list(r["paths"].values())
        rows_n, chunks = paths.count("rows"), paths.count("row chunks")
        lines.append(
            f"| {r['layout']} | {r['rank']} | {r['cpu']:.2f} | {r['wall']:.2f} | "
            f"{r['peak'] / MiB:.0f} | {bound / MiB:.0f} | {r['peak'] <= bound} | "
            f"{rows_n} / {chunks} / {len(paths) - rows_n - chunks} | {r['bitwise']} |"
        )
    full = sorted({f"{r['layout']}: {n} ({v})" for r in rows for n, v in r["paths"].items()
                   if v.startswith("full")})  # fmt: skip
    lines += ["", "Parameters built whole: " + ("; ".join(full) or "none") + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
