"""Per-call cost of a descriptor-specialized program vs calling the exported program directly.

A small MLP (16 -> 32 -> 4, fp32, CPU, one intra-op thread) is exported with
``torch.export`` and a symbolic batch dim; the baseline calls that
``ExportedProgram.module()`` directly. ``torchdefer.script`` of the same MLP
with ``{"input": MetaTensorType(["b", 16], torch.float32)}`` is called the
same way; its check alone (binding, every descriptor check, the lookup of
the graph that covers the call) is timed separately, as is the jit backend
against ``torch.jit.script``. Each case runs ``--calls`` calls per round,
cases interleaved round by round so that load on a shared machine hits all
alike; the report gives the median over ``--rounds`` of each round's mean,
and ratios per round, then their median.

Run:  python bench/bench_descriptor_overhead.py [--rounds 30 --calls 2000]
Writes bench/results/descriptor_overhead.md (and prints it).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torchdefer
from bench.environment import describe
from torchdefer.descriptors import MetaTensorType

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "descriptor_overhead.md"
BASELINE = "ExportedProgram.module() (baseline)"


def cases(batch: int) -> dict[str, object]:
    """name -> zero-argument callable, for one batch size."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).eval()
    x = torch.randn(batch, 16)
    desc = {"input": MetaTensorType(["b", 16], torch.float32)}
    exported = torch.export.export(
        mlp, (torch.randn(8, 16),), dynamic_shapes=({0: torch.export.Dim("b")},)
    )
    direct = exported.module()
    program = torchdefer.script(mlp, desc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit's deprecation notice
        scripted = torch.jit.script(mlp)
        jit_program = torchdefer.script(mlp, desc, backend="jit")
    for f in (direct, program, scripted, jit_program):
        torch.testing.assert_close(f(x), mlp(x))
    graph = exported.graph_module
    weights = [*mlp.parameters()]
    return {
        "eager module": lambda: mlp(x),
        "ExportedProgram.module() (baseline)": lambda: direct(x),
        "its lifted graph, weights passed by hand (floor)": lambda: graph(*weights, x),
        "torchdefer program (export)": lambda: program(x),
        "its check alone": lambda: program._check((x,), {}),
        "torch.jit.script (jit baseline)": lambda: scripted(x),
        "torchdefer program (jit)": lambda: jit_program(x),
    }


def measure(funcs: dict[str, object], rounds: int, calls: int) -> dict[str, list[float]]:
    for f in funcs.values():
        for _ in range(200):
            f()
    out: dict[str, list[float]] = {name: [] for name in funcs}
    for _ in range(rounds):
        for name, f in funcs.items():
            start = time.perf_counter()
            for _ in range(calls):
                f()
            out[name].append((time.perf_counter() - start) / calls * 1e6)
    return out


def report(results: dict[int, dict[str, list[float]]], argv: list[str]) -> str:
    lines = ["# Descriptor check overhead", ""]
    facts = describe(argv)
    python = sys.executable.replace(str(ROOT) + "/", "")
    facts["Command"] = f"`{shlex.join([python, *argv])}` (from the repository root)"
    facts["Threads"] = f"torch intra-op threads: {torch.get_num_threads()}"
    lines += [f"- {k}: {v}" for k, v in facts.items()]
    note = (
        "Median over rounds of the mean µs per call; ratios are taken per round "
        "against the baseline of the same backend, then the median."
    )
    lines += ["", note, ""]
    targets = []
    for batch, times in results.items():
        note = " (b=1: a graph built for that size on first use)" if batch == 1 else ""
        lines += [
            f"## batch {batch}{note}",
            "",
            "| case | µs per call | ratio to baseline |",
            "|---|---|---|",
        ]
        for name, samples in times.items():
            base = (
                "torch.jit.script (jit baseline)"
                if "jit" in name
                else "ExportedProgram.module() (baseline)"
            )
            ratio = statistics.median(a / b for a, b in zip(samples, times[base]))
            shown = "-" if name == "its check alone" else f"{ratio:.2f}"
            lines.append(f"| {name} | {statistics.median(samples):.1f} | {shown} |")
        ours, base = times["torchdefer program (export)"], times[BASELINE]
        export_ratio = statistics.median(a / b for a, b in zip(ours, base))
        check = statistics.median(times["its check alone"])
        targets += [
            f"| batch {batch}: end to end vs {BASELINE} | <= 1.2x | {export_ratio:.2f}x |",
            f"| batch {batch}: the check itself | <= 10 µs | {check:.1f} µs |",
        ]
        lines.append("")
    lines += [
        "## Targets (issue 10)",
        "",
        "| target | bound | measured |",
        "|---|---|---|",
        *targets,
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    argv = sys.argv if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv[1:])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per-call overhead, not kernel parallelism
    try:
        results = {batch: measure(cases(batch), args.rounds, args.calls) for batch in (8, 1)}
    finally:  # main() also runs inside the test suite's process
        torch.set_num_threads(threads)
    text = report(results, argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
