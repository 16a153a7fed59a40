"""dcp.load into a deferred FSDP2 model (torchtitan's flow): what replay still draws.

W gloo ranks (CPU, one thread each) build ``bench/titan_model.py``'s Llama
(torchtitan's init: ``trunc_normal_`` linears, the output's 3-sigma loop, a
``normal_`` embedding) from seed 0, ``fully_shard`` every block and the root,
``dcp.load`` a checkpoint of the seed-1 model into ``model.state_dict()``, and
materialize. Per rank: the random calls replay ran and the numbers they drew
(every call into the generator, into place or scratch), CPU time, and the same
for eager (build, shard, ``dcp.load``), the baseline of the same run. Every
local shard is compared bit for bit with eager's, and the generator state
after with eager's.

    python bench/bench_dcp_load.py [--small 2,512,1408] [--vocab 32000] [--worlds 2 4] \
        [--label after]

``--label`` names the run; the report keeps one table per label, so the same
command run on an older checkout (``PYTHONPATH=<old>/src``) with ``--label
before`` shows what a change saved. Results: ``results/dcp_load.md`` and
``dcp_load.json``, with the commands.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench.bench_sharded import _digest, _free_port
from bench.titan_model import LLAMA3_8B, TitanArgs, TitanLlama


def _shard(model) -> None:
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers.values():
        fully_shard(layer)
    fully_shard(model)


def _load(model, path: str) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gloo's single-thread notes
        dcp.load(model.state_dict(), checkpoint_id=path)


class _Draws:
    """Counts the random calls replay makes (``materialize._rng_replay.draw``, which both full
    and row replay call) and the elements they produce."""

    def __init__(self) -> None:
        import torchdefer.materialize._local_call as local_call
        import torchdefer.materialize._rng_replay as replay_rng

        self.ops = self.numbers = 0
        self._modules = (replay_rng, local_call)
        self._draw = replay_rng.draw

    def __enter__(self) -> _Draws:
        def counting(node, *args):
            out, after = self._draw(node, *args)
            self.ops += 1
            outs = out if isinstance(out, (list, tuple)) else [out]
            self.numbers += sum(t.numel() for t in outs if isinstance(t, torch.Tensor))
            return out, after

        for module in self._modules:
            module.draw = counting
        return self

    def __exit__(self, *exc) -> None:
        for module in self._modules:
            module.draw = self._draw


def _rank(rank: int, world: int, port: int, args: dict, path: str, out: str) -> None:
    import torch.distributed as dist

    import torchdefer
    import torchdefer.distributed

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(1)
    saved = TitanLlama(TitanArgs(**args))
    _shard(saved)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(saved.state_dict(), checkpoint_id=path)
    del saved
    dist.barrier()
    cpu = time.process_time()
    torch.manual_seed(0)
    eager = TitanLlama(TitanArgs(**args))
    _shard(eager)
    _load(eager, path)
    eager_cpu = time.process_time() - cpu
    eager_rng = torch.get_rng_state()
    expected = {n: _digest(p.to_local()) for n, p in eager.named_parameters()}
    del eager
    cpu = time.process_time()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(TitanLlama, TitanArgs(**args))
    _shard(model)
    _load(model, path)
    with _Draws() as draws:
        torchdefer.distributed.materialize_module(model)
    deferred_cpu = time.process_time() - cpu
    got = {n: _digest(p.to_local()) for n, p in model.named_parameters()}
    row = dict(
        rank=rank, world=world, ops=draws.ops, numbers=draws.numbers, eager_cpu=eager_cpu,
        deferred_cpu=deferred_cpu, bitwise=got == expected,
        rng=torch.equal(torch.get_rng_state(), eager_rng),
        local_numbers=sum(p.to_local().numel() for p in model.parameters()),
    )  # fmt: skip
    Path(out, f"rank-{world}-{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", default="2,512,1408", help="layers,dim,hidden")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--label", default="after")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    o = p.parse_args()
    layers, dim, hidden = (int(x) for x in o.small.split(","))
    args = asdict(replace(LLAMA3_8B, n_layers=layers, dim=dim, hidden=hidden, vocab=o.vocab,
                          n_heads=dim // 128, n_kv_heads=max(1, dim // 512)))  # fmt: skip
    os.environ["OMP_NUM_THREADS"] = "1"
    tmp = tempfile.mkdtemp()
    rows = []
    for world in o.worlds:
        path = str(Path(tmp, f"ckpt-{world}"))
        mp.spawn(_rank, args=(world, _free_port(), args, path, tmp), nprocs=world)
        rows += [json.loads(Path(tmp, f"rank-{world}-{r}.json").read_text())
                 for r in range(world)]
    source = os.environ.get("PYTHONPATH")  # an older checkout's src, for a "before" run
    command = ((f"PYTHONPATH={source} " if source else "")
               + f"nice -n 10 python bench/bench_dcp_load.py --small {o.small} --vocab {o.vocab} "
               f"--worlds {' '.join(map(str, o.worlds))} --label {o.label}")
    o.out.mkdir(parents=True, exist_ok=True)
    store = o.out / "dcp_load.json"
    runs = json.loads(store.read_text()) if store.exists() else {}
    runs[o.label] = dict(command=command, torch=torch.__version__, args=args, rows=rows,
                         commit=_commit())
    store.write_text(json.dumps(runs, indent=1))
    text = _report(runs)
    (o.out / "dcp_load.md").write_text(text)
    print(text)


def _commit() -> str:
    """The commit of the torchdefer that ran (its checkout's HEAD, marked if changed)."""
    import subprocess

    import torchdefer

    where = Path(torchdefer.__file__).resolve().parent
    git = ["git", "-C", str(where)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


def _report(runs: dict) -> str:
    lines = [
        "# dcp.load into a deferred FSDP2 model (`bench/bench_dcp_load.py`)",
        "",
        "torchtitan's flow: `deferred_init`, `fully_shard`, `dcp.load(model.state_dict())`, "
        "materialize. *Random calls* and *numbers* are what replay drew (into place or "
        "scratch); *local* is the rank's shard elements. CPU seconds per rank (one thread), "
        "eager = build + shard + `dcp.load`, measured in the same run.",
    ]
    for label, run in runs.items():
        a = run["args"]
        lines += [
            "", f"## {label}", "",
            f"{a['n_layers']} layers, dim {a['dim']}, hidden {a['hidden']}, vocab {a['vocab']}; "
            f"torch {run['torch']}; torchdefer at {run.get('commit', 'unknown')}. "
            f"Command: `{run['command']}`", "",
            "| world | rank | random calls | numbers drawn | local | deferred CPU s | "
            "eager CPU s | deferred / eager | bitwise | generator as eager |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in run["rows"]:
            lines.append(
                f"| {r['world']} | {r['rank']} | {r['ops']} | {r['numbers']:,} | "
                f"{r['local_numbers']:,} | {r['deferred_cpu']:.2f} | {r['eager_cpu']:.2f} | "
                f"{r['deferred_cpu'] / r['eager_cpu']:.2f} | {r['bitwise']} | {r['rng']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
