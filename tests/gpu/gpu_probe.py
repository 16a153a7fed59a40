"""``make test-gpu``'s differential probe: torchdefer's CUDA offset model against the GPU.

For every case of ``gpu_cases`` (each row of ``torchdefer.rng.cuda_increments``'s
table, dtypes bool to complex128, sizes 0, 1, T, T+1, 2T+1, 8T+1, a non-dense
view and a view whose byte extent passes 2**31 - 1) it runs the eager op from
a private generator, measures how far the Philox offset moved, and compares
that with the model's prediction; ops the model runs are measured and shown.
Then the end-to-end checks of ``gpu_e2e``. It prints one table and a verdict
(exit status 1 if anything differs) and skips cleanly without CUDA::

    python tests/gpu/gpu_probe.py [--out bench/results/gpu-probe.md] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_cases
import gpu_e2e

from torchdefer.rng import philox
from torchdefer.rng.philox import DeviceShape

REFUSED = "-"


def measure(case: gpu_cases.Case, device: torch.device, pool: dict) -> int | str:
    """The offset change of the eager op, or REFUSED if eager raises."""
    try:
        t = case.tensor(device, pool)
        g = torch.Generator(device=device).manual_seed(1234)
        before = philox.offset_of(g.get_state())[1]
        case.op.run(t, g)
        torch.cuda.synchronize(device)
        return philox.offset_of(g.get_state())[1] - before
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as refused:
        try:  # a refusal, or a kernel fault that leaves every later case failing?
            torch.cuda.synchronize(device)
        except RuntimeError as broken:
            raise RuntimeError(f"the CUDA context broke at {case}: {refused}") from broken
        return REFUSED


def cell(predicted: int | None, measured: int | str, counted: bool) -> tuple[str, bool]:
    """The table cell and whether it is a mismatch."""
    if measured == REFUSED:
        return REFUSED, False
    if not counted or predicted is None:
        return f"({measured})", False  # run by the model: shown, not judged
    if predicted == measured:
        return str(measured), False
    return f"**{predicted}≠{measured}**", True


def probe_table(device: torch.device, shape: DeviceShape, quick: bool) -> tuple[list[str], int]:
    """Markdown rows (one per op and dtype, a column per layout) and the number of mismatches.

    A probe that compared nothing counts as one mismatch: it proved nothing.
    """
    rows: dict[tuple[str, str], list[str]] = defaultdict(list)
    wrong = 0
    compared = 0
    pool: dict = {}
    labels: list[str] = []
    for case in gpu_cases.all_cases(shape):
        if quick and case.layout.label.startswith("2x3"):
            continue  # the 2 GiB buffer
        if case.layout.label not in labels:
            labels.append(case.layout.label)
        measured = measure(case, device, pool)
        predicted = case.predicted(shape) if measured != REFUSED else None
        text, bad = cell(predicted, measured, case.op.counted)
        wrong += bad
        compared += predicted is not None and measured != REFUSED
        rows[(case.op.name, str(case.dtype).removeprefix("torch."))].append(text)
    head = ["| op | dtype | " + " | ".join(labels) + " |",
            "|" + " --- |" * (len(labels) + 2)]
    body = [f"| {op} | {dtype} | " + " | ".join(cells) + " |"
            for (op, dtype), cells in rows.items() if any(c != REFUSED for c in cells)]
    return head + body, wrong + (compared == 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("--quick", action="store_true", help="skip the 2 GiB strided case")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu probe: skipped, no CUDA device here (torch.cuda.is_available() is False).")
        return 0
    device = torch.device("cuda", torch.cuda.current_device())
    shape = DeviceShape.of(device)
    props = torch.cuda.get_device_properties(device)
    lines = [
        "# CUDA Philox offset probe (`make test-gpu`)",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; torch "
        f"{torch.__version__}, CUDA {torch.version.cuda}; {props.name}: "
        f"{shape.multi_processor_count} SMs x {shape.max_threads_per_multi_processor} threads, "
        f"T = {gpu_cases.threads(shape)}",
        "",
        "Cells: the measured offset change where the model predicted the same; "
        "**predicted≠measured** where not; (n) measured for ops the model runs; - eager refuses.",
        "",
    ]
    try:
        table, wrong = probe_table(device, shape, args.quick)
    except RuntimeError as e:  # the context broke: report it, with the verdict
        table, wrong = [f"Probe aborted: {e}"], 1
    lines += table
    checks = gpu_e2e.run_all(device)
    failed = [c for c in checks if not c[1]]
    lines += ["", "| end-to-end check | result |", "| --- | --- |"]
    lines += [f"| {name} | {'ok' if ok else 'FAILED ' + detail} |" for name, ok, detail in checks]
    verdict = "PASS" if not wrong and not failed else "FAIL"
    lines += ["", f"Verdict: {verdict} ({wrong} offset mismatches, {len(failed)} of "
              f"{len(checks)} end-to-end checks failed)."]
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report + "\n")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
