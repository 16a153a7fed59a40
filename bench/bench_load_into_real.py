"""Loading into a materialized model: torchdefer.load_state_dict vs Module.load_state_dict.

A model of ``--layers`` blocks (Linear 1024x1024 + LayerNorm; real, fp32) is
loaded from an in-memory state dict, once in fp32 (every copy's source is the
caller's tensor) and once in bf16 (every source converted first). Each case
runs in its own spawned process, the cases taking turns, ``--repeats`` times;
time is the call, peak the RSS high-water mark during the call minus RSS
before (``VmHWM``, reset right before). All or nothing costs no backup of the
model: torchdefer's peak should be eager's (plus the converted sources in
bf16, which eager's ``copy_`` converts on the fly).

Run:  python bench/bench_load_into_real.py [--layers 48] [--repeats 5]
Prints a table of medians (min, max).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time


def _build(layers: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.LayerNorm(1024))
                           for _ in range(layers)])


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(field)


def _case(how: str, dtype: str, layers: int, out) -> None:
    import torch

    import torchdefer

    model = _build(layers)
    torch.manual_seed(1)
    state = {k: v.to(getattr(torch, dtype)) if v.is_floating_point() else v
             for k, v in _build(layers).state_dict().items()}
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM
    before = _rss_kib("VmRSS")
    start = time.perf_counter()
    if how == "eager":
        model.load_state_dict(state)
    else:
        torchdefer.load_state_dict(model, state)
    seconds = time.perf_counter() - start
    out.put((seconds, (_rss_kib("VmHWM") - before) / 1024))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results: dict = {}
    for _ in range(args.repeats):
        for dtype in ("float32", "bfloat16"):
            for how in ("eager", "torchdefer"):
                queue = ctx.Queue()
                p = ctx.Process(target=_case, args=(how, dtype, args.layers, queue))
                p.start()
                results.setdefault((dtype, how), []).append(queue.get())
                p.join()
    print(f"{args.layers} layers, {args.repeats} repeats; median (min, max)")
    print("| source dtype | loader | time (ms) | peak above before (MiB) | time / eager |")
    print("|---|---|---|---|---|")
    for (dtype, how), runs in results.items():
        times = [1000 * t for t, _ in runs]
        peaks = [m for _, m in runs]
        eager = statistics.median(1000 * t for t, _ in results[(dtype, "eager")])
        print(f"| {dtype} | {how} | {statistics.median(times):.1f} ({min(times):.1f}, "
              f"{max(times):.1f}) | {statistics.median(peaks):.1f} ({min(peaks):.1f}, "
              f"{max(peaks):.1f}) | {statistics.median(times) / eager:.2f} |")


if __name__ == "__main__":
    main()
