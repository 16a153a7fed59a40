"""What the program-file checks cost at load: torchdefer.load_program vs torch.export.load.

A 4-layer ``nn.TransformerEncoder`` (d_model 64, fp32, CPU) is scripted with
a symbolic batch and sequence length and written with ``torchdefer.save_program``;
the same model's ``torch.export.export`` is written with
``torch.export.save``. Each round times, interleaved so that load on a shared
machine hits all alike: ``torch.export.load`` of its file (the baseline),
``torchdefer.load_program`` of ours (every check: zip headers and sizes, pytree specs
decoded, shape expressions parsed, the operator allowlist on the JSON and on
the built graph, descriptors), and the operator allowlist alone (both
passes). The report gives medians over ``--rounds`` and per-round ratios
against the baseline, then their median.

Run:  python bench/bench_program_load.py [--rounds 15]
Writes bench/results/program_load.md (and prints it).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torchdefer
from bench.environment import describe
from torchdefer.descriptors import MetaTensorType
from torchdefer.descriptors._operators import check_graph_json, check_graph_module

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "program_load.md"
BASELINE = "torch.export.load (baseline)"


def files(folder: Path) -> dict[str, object]:
    """name -> zero-argument callable timing one load."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).eval()
    x = torch.randn(2, 8, 64)
    ours, theirs = folder / "model.tdp", folder / "model.pt2"
    program = torchdefer.script(model, {"src": MetaTensorType(["b", "s", 64], torch.float32)})
    program(x)
    torchdefer.save_program(program, ours)
    batch, length = torch.export.Dim("b"), torch.export.Dim("s")
    exported = torch.export.export(model, (x,), dynamic_shapes=({0: batch, 1: length},))
    torch.export.save(exported, theirs)
    loaded = torchdefer.load_program(ours)
    torch.testing.assert_close(loaded(x), model(x))
    torch.testing.assert_close(torch.export.load(theirs).module()(x), model(x))
    graph = json.loads(zipfile.ZipFile(ours).read("graph0.json"))
    module = next(iter(loaded._variants.values())).program.graph_module

    def allowlist() -> None:
        check_graph_json(graph)
        check_graph_module(module)

    return {BASELINE: lambda: torch.export.load(theirs),
            "torchdefer.load_program": lambda: torchdefer.load_program(ours),
            "operator allowlist alone (JSON + graph module)": allowlist,
            "nodes": len(list(module.graph.nodes))}


def measure(cases: dict[str, object], rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in cases if name != "nodes"}
    for _ in range(rounds):
        for name in times:
            start = time.perf_counter()
            cases[name]()  # type: ignore[operator]
            times[name].append(time.perf_counter() - start)
    return times


def report(times: dict[str, list[float]], nodes: int, argv: list[str]) -> str:
    facts = describe(argv)
    python = sys.executable.replace(str(ROOT) + "/", "")
    facts["Command"] = f"`{shlex.join([python, *argv])}` (from the repository root)"
    facts["Threads"] = f"torch intra-op threads: {torch.get_num_threads()}"
    lines = ["# Program file load: the cost of the checks", "",
             *[f"- {k}: {v}" for k, v in facts.items()], "",
             f"Model: 4-layer TransformerEncoder, d_model 64; graph of {nodes} nodes. Median over "
             "rounds of ms per load; ratios per round against the baseline, then the median.", "",
             "| case | ms per load | ratio to baseline |", "|---|---|---|"]
    for name, samples in times.items():
        ratio = statistics.median(a / b for a, b in zip(samples, times[BASELINE]))
        lines.append(f"| {name} | {1000 * statistics.median(samples):.1f} | {ratio:.3f} |")
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> str:
    argv = sys.argv if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv[1:])
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        cases = files(Path(folder))
        times = measure(cases, args.rounds)
    text = report(times, int(cases["nodes"]), argv)  # type: ignore[call-overload]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
