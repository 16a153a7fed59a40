"""What placing one recorded random op in its stream costs, against a baseline tree.

Each random op recorded inside ``deferred_init`` is placed in its generator's
stream (``RngRecorder.place``: its position, and a marker left in the real
generator). This measures that call's thread CPU time per op, and the whole
recording's CPU time per op, for a program of random inits on a few shapes
(``normal_``, ``uniform_``, ``kaiming_uniform_``, ``bernoulli_``), with the
garbage collector off (its pauses land on whichever call allocates, not on
the one that made the garbage). The tree under test and a baseline tree
(``--baseline DIR``: the ``src`` folder of another checkout, e.g. made with
``git worktree add /tmp/before <commit>``) run in alternating subprocesses,
``--rounds`` times each; each subprocess reports the least of ``--repeats``
recordings. Reported: medians over the rounds, and their ratio.

    python bench/bench_rng_placement.py --baseline /tmp/before/src [--label COMMIT]
        [--rounds 5] [--repeats 5] [--layers 500] [--out bench/results]

writes ``rng_placement.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

__all__ = ["main"]

_ROOT = Path(__file__).resolve().parent.parent

# Run in a subprocess with PYTHONPATH set to the tree measured.
_CHILD = r"""
import gc, json, sys, time
import torch
import torchdefer
from torch import nn
from torchdefer.recorder._rng_placement import RngRecorder

gc.disable()
spent = [0.0, 0]
place = RngRecorder.place

def timed(self, *args, **kwargs):
    t0 = time.thread_time()
    place(self, *args, **kwargs)
    spent[0] += time.thread_time() - t0
    spent[1] += 1

RngRecorder.place = timed
LAYERS = int(sys.argv[1])

def build():
    for i in range(LAYERS):
        w = torch.empty(64 + i % 4, 48)
        w.normal_(0, 0.02)
        w.uniform_(-0.1, 0.1)
        nn.init.kaiming_uniform_(w, a=5 ** 0.5)
        torch.empty(32).bernoulli_(0.5)

place_us, total_us = [], []
for _ in range(int(sys.argv[2])):
    spent[:] = [0.0, 0]
    t0 = time.thread_time()
    torchdefer.deferred_init(build)
    total = time.thread_time() - t0
    place_us.append(spent[0] / spent[1] * 1e6)
    total_us.append(total / spent[1] * 1e6)
print(json.dumps({"place_us": min(place_us), "record_us_per_random_op": min(total_us),
                  "ops": spent[1]}))
"""


def _measure(src: Path, layers: int, repeats: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(layers), str(repeats)], env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="src folder of the baseline")
    parser.add_argument("--label", default="", help="what the baseline is (a commit)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=500)
    parser.add_argument("--out", type=Path, default=_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    trees = {"baseline": args.baseline.resolve(), "this tree": _ROOT / "src"}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for i in range(args.rounds):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for name in order:
            runs[name].append(_measure(trees[name], args.layers, args.repeats))
    rows = []
    for field in ("place_us", "record_us_per_random_op"):
        base = statistics.median(r[field] for r in runs["baseline"])
        now = statistics.median(r[field] for r in runs["this tree"])
        rows.append((field, base, now, now / base))
    _write(args, runs, rows)


def _write(args: argparse.Namespace, runs: dict, rows: list) -> None:
    commit = subprocess.run(["git", "-C", str(_ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(_ROOT), "status", "--porcelain", "--", "src"],
                           capture_output=True, text=True).stdout.strip()
    commit += " with uncommitted changes in src" if dirty else ""
    import torch

    names = {"place_us": "`RngRecorder.place`, µs CPU per random op",
             "record_us_per_random_op": "whole recording, µs CPU per random op"}
    lines = [
        "# Placing a recorded random op in its stream",
        "",
        f"Baseline: {args.label or args.baseline.name}. "
        f"Command: `python bench/bench_rng_placement.py --baseline <src of the baseline> "
        f"--rounds {args.rounds} --repeats {args.repeats} --layers {args.layers}` "
        f"(commit {commit}, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end). "
        f"{runs['this tree'][0]['ops']} random ops per recording; medians of "
        f"{args.rounds} alternated rounds, each the least of {args.repeats} recordings; "
        "thread CPU time, GC off.",
        "",
        "| measure | baseline | this tree | ratio |",
        "| --- | --- | --- | --- |",
    ]
    for field, base, now, ratio in rows:
        lines.append(f"| {names[field]} | {base:.1f} | {now:.1f} | **{ratio:.2f}x** |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rng_placement.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
