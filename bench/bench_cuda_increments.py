"""What the CUDA increment table costs per recorded random op (runs on any host).

On a CUDA host every random op recorded on the GPU is counted when placed
(``rng._stream.call_effect``). The table
(``torchdefer.rng.cuda_increments.increment``) reads TensorIterator's geometry
and the 32-bit split; the baseline is the launch formula alone
(``philox.counter_increment``, what a single-launch model costs), and
recording one ``torch.randn`` with ``deferred_init`` on the CPU for scale.
Medians of repeated timings, one run, ratios against the formula::

    nice python bench/bench_cuda_increments.py [--out bench/results/cuda_increments.md]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import torchdefer
from torchdefer.rng import cuda_increments
from torchdefer.rng.philox import DeviceShape, counter_increment

H100 = DeviceShape(132, 2048)
aten = torch.ops.aten


def _time(call, repeat: int = 7, number: int = 2000) -> float:
    """Median seconds per call."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            call()
        runs.append((time.perf_counter() - start) / number)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    contiguous = torch.empty(4096, 4096, device="meta")
    strided = torch.empty(4096, 8192, device="meta")[:, ::2].t()
    wide = torch.empty(0, device="meta").as_strided((2, 3), (1 << 30, 1))
    baseline = _time(lambda: counter_increment(4096 * 4096, 4, H100))
    cases = {
        "formula alone (baseline)": baseline,
        "table, contiguous 4096x4096": _time(
            lambda: cuda_increments.increment(aten.normal_.default, (contiguous,), {}, contiguous,
                                              H100)),
        "table, transposed strided view": _time(
            lambda: cuda_increments.increment(aten.normal_.default, (strided,), {}, strided, H100)),
        "table, 2x3 view spanning 4 GiB (sub-launches)": _time(
            lambda: cuda_increments.increment(aten.normal_.default, (wide,), {}, wide, H100)),
        "random_(0, None) on int8": _time(
            lambda: cuda_increments.increment(getattr(aten.random_, "from"), (contiguous, 0, None),
                                              {}, contiguous, H100)),
        "recording one torch.randn(64) in deferred_init, for scale": _time(
            lambda: torchdefer.deferred_init(lambda: [torch.randn(64) for _ in range(100)]),
            repeat=5, number=5) / 100,
    }
    lines = ["# CUDA increment table: cost per counted op", "",
             f"torch {torch.__version__}; `nice python bench/bench_cuda_increments.py`; "
             "median of 7 runs; ratio to the launch formula alone.", "",
             "| case | µs per call | x formula |", "| --- | ---: | ---: |"]
    lines += [f"| {name} | {t * 1e6:.2f} | {t / baseline:.1f} |" for name, t in cases.items()]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)
    return report


if __name__ == "__main__":
    main()
