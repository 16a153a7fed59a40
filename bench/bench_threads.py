"""What another live Python thread costs a recording.

While the recording thread is the only Python thread, the CPU generator
holds a cheap marker between random ops; with another thread alive (which
could draw from the generator), every random op moves the generator to its
exact state at once (``recorder/_threads.py``). This measures
``deferred_init`` of a stack of linear layers both ways, in one process, as
a ratio against the lone-thread time measured in the same run (medians of
``--repeat`` runs, each from a fresh seed).

    nice -n 10 .venv/bin/python -m bench.bench_threads --layers 16 --width 1024
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import torch
from torch import nn

import torchdefer


def _build(layers: int, width: int) -> nn.Module:
    return nn.Sequential(*(nn.Linear(width, 4 * width) for _ in range(layers)))


def _time(layers: int, width: int, repeat: int) -> float:
    times = []
    for i in range(repeat):
        torch.manual_seed(i)
        start = time.perf_counter()
        torchdefer.deferred_init(_build, layers, width)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results/threads.md"))
    args = parser.parse_args()
    torchdefer.deferred_init(nn.Linear, 2, 2)  # warm caches and probes
    alone = _time(args.layers, args.width, args.repeat)
    stop = threading.Event()
    idle = threading.Thread(target=stop.wait, daemon=True)
    idle.start()
    try:
        with_thread = _time(args.layers, args.width, args.repeat)
    finally:
        stop.set()
        idle.join()
    ops = 2 * args.layers
    lines = [
        "# Recording with another Python thread alive",
        "",
        f"`nice -n 10 .venv/bin/python -m bench.bench_threads --layers {args.layers} "
        f"--width {args.width} --repeat {args.repeat}` (torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op threads)",
        "",
        f"deferred_init of {args.layers} x nn.Linear({args.width}, {4 * args.width}): "
        f"{ops} random ops, {args.layers * 4 * args.width * (args.width + 1):,} numbers drawn "
        "by eager.",
        "",
        "| threads alive | median s | ratio |",
        "|---|---|---|",
        f"| recording thread only (markers) | {alone:.3f} | 1.00 |",
        f"| plus one idle thread (exact state per op) | {with_thread:.3f} | "
        f"{with_thread / alone:.2f} |",
        "",
        f"Per random op with a thread alive: {(with_thread - alone) / ops * 1e3:.1f} ms more.",
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
