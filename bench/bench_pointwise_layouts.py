"""Recording cost of the pointwise layout rules (issue 24): µs per recorded op.

``deferred_init`` of a loop of elementwise ops (``t * 2``, ``t + u``,
``t.abs()``, ``t.clamp(-1, 1)``, ``t.eq(1.0)``, ``2 ** t``,
``t.masked_fill(m, 0)``, ``torch.lerp(t, u, 0.5)``) on a (64, 64) tensor, with
the rules of ``fake/_pointwise.py`` on and off (off: the tables emptied, the
baseline), alternated in one process so both see the same machine load.
Reported: the medians of ``--runs`` rounds and their ratio.

    python bench/bench_pointwise_layouts.py [--runs 7] [--ops 2000] [--out bench/results]

writes ``pointwise_layouts.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import torchdefer
from torchdefer.fake import _layout as layout


def _build(n: int) -> None:
    t = torch.rand(64, 64)
    u = torch.rand(64)
    m = t > 0.5
    for _ in range(n // 8):
        t * 2
        t + u
        t.abs()
        t.clamp(-1, 1)
        t.eq(1.0)
        2**t
        t.masked_fill(m, 0.0)
        torch.lerp(t, u, 0.5)


def _timed(n: int) -> float:
    start = time.process_time()  # CPU time: the machine is shared
    torchdefer.deferred_init(_build, n)
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    rules = (layout._UNARY, layout._ITERATED, layout.ITERATED_OPERANDS)
    off = ({}, {op: n for op, n in layout._ITERATED.items()
                if op not in layout.BINARY_ITERATED and op not in layout.TERNARY_ITERATED}, {})
    times: dict[str, list[float]] = {"on": [], "off": []}
    _timed(args.ops)  # warm-up
    for _ in range(args.runs):
        for name, (unary, iterated, operands) in (("off", off), ("on", rules)):
            layout._UNARY, layout._ITERATED, layout.ITERATED_OPERANDS = unary, iterated, operands
            layout._restrided.clear()
            times[name].append(_timed(args.ops))
    layout._UNARY, layout._ITERATED, layout.ITERATED_OPERANDS = rules
    layout._restrided.clear()
    on, off_ = statistics.median(times["on"]), statistics.median(times["off"])
    text = (f"# Pointwise layout rules: recording cost\n\n"
            f"`python bench/bench_pointwise_layouts.py --runs {args.runs} --ops {args.ops}`"
            f" (torch {torch.__version__})\n\n"
            f"| rules | CPU µs per recorded op (median of {args.runs}) |\n|---|---|\n"
            f"| off (baseline) | {off_:.1f} |\n| on | {on:.1f} |\n\n"
            f"ratio on/off: {on / off_:.3f}\n")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "pointwise_layouts.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
