"""Recording cost: ``deferred_init`` of the 70B Llama against the meta device, and µs per op.

One process, after a warm-up build of a tiny Llama both ways (lazy imports,
dispatch caches, the RNG tables: one-time costs a user pays once per process).
Then ``--runs`` rounds, each building the 70B Llama shape (``transformers``
``LlamaForCausalLM``, Llama 3.1 70B config, fp32) under ``torch.device("meta")``
and under ``deferred_init``, alternated so both see the same machine load.
The model of the previous round is freed (and ``gc.collect()`` run) outside
the timed region. Reported: medians of wall time, their ratio, recorded ops
and µs per recorded op, and the time the cyclic garbage collector took inside
the ``deferred_init`` windows (it runs when enough objects were made: part of
the cost a user sees). The same ratio is given in this thread's CPU time
(least of the runs), which other processes on a shared machine disturb less
than wall time; and the first ``deferred_init`` of the process on its own: it
also builds the generator's jump tables for this model's number of draws,
which later runs reuse.

Then µs per call of a few common ops (``bench/recording.py``'s loops: best
of ``--repeats`` loops of ``--calls`` calls) recorded and on meta; and, with
``--profile N``, the N top functions by own time of one more profiled
``deferred_init`` (cProfile: it slows small calls, read it for ranks, not
times).

    python bench/bench_recording_cost.py [--runs 7] [--profile 25] [--out bench/results]

writes ``recording_cost.md`` and ``recording_cost.json`` under ``--out``
(``--name before`` writes ``before.md``, ``before.json``).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/bench_recording_cost.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from bench.models import build_fn, spec_named

__all__ = ["main", "measure_construction", "measure_ops"]

MODEL = "llama-70b"
# bench/recording.py's ops that a model's construction consists of.
OPS = ("torch.empty", "Tensor.normal_", "Tensor.uniform_", "Tensor.fill_", "Tensor.t (a view)",
       "nn.init.kaiming_uniform_", "nn.Linear(1024, 1024)")


def _gc_timer() -> tuple[dict[str, float], Any]:
    """A gc callback summing the collector's time into the returned dict."""
    acc = {"seconds": 0.0, "start": 0.0, "collections": 0}

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            acc["start"] = time.perf_counter()
        else:
            acc["seconds"] += time.perf_counter() - acc["start"]
            acc["collections"] += 1

    return acc, callback


def _build(method: str, fn, args) -> tuple[Any, float, float]:
    """The model, wall seconds, and this thread's CPU seconds (less disturbed by
    other processes on a shared machine)."""
    import torchdefer

    torch.manual_seed(0)
    start, cpu = time.perf_counter(), time.thread_time()
    if method == "meta":
        with torch.device("meta"):
            model = fn(*args)
    else:
        model = torchdefer.deferred_init(fn, *args)
    return model, time.perf_counter() - start, time.thread_time() - cpu


def measure_construction(runs: int) -> dict[str, Any]:
    """Medians over ``runs`` alternated rounds of meta and deferred_init of the 70B Llama."""
    fn, args = build_fn(spec_named(MODEL))
    tiny_fn, tiny_args = build_fn(spec_named("llama-tiny"))
    for method in ("meta", "deferred_init"):
        _build(method, tiny_fn, tiny_args)
    gc_time, callback = _gc_timer()
    times: dict[str, list[float]] = {"meta": [], "deferred_init": []}
    cpu: dict[str, list[float]] = {"meta": [], "deferred_init": []}
    gc_seconds, ops = [], 0
    for _ in range(runs):
        for method in ("meta", "deferred_init"):
            gc.collect()
            gc_time["seconds"] = 0.0
            gc.callbacks.append(callback)
            try:
                model, seconds, cpu_seconds = _build(method, fn, args)
            finally:
                gc.callbacks.remove(callback)
            times[method].append(seconds)
            cpu[method].append(cpu_seconds)
            if method == "deferred_init":
                gc_seconds.append(gc_time["seconds"])
                ops = next(iter(model.parameters()))._graph.op_count
            del model
    meta, deferred = (statistics.median(times[m]) for m in ("meta", "deferred_init"))
    meta_cpu, deferred_cpu = (min(cpu[m]) for m in ("meta", "deferred_init"))
    return {
        "model": MODEL, "runs": runs, "meta_s": meta, "deferred_s": deferred,
        "ratio": deferred / meta, "ops": ops, "us_per_op": deferred / ops * 1e6,
        "meta_cpu_s": meta_cpu, "deferred_cpu_s": deferred_cpu,
        "cpu_ratio": deferred_cpu / meta_cpu, "cpu_us_per_op": deferred_cpu / ops * 1e6,
        "first_deferred_s": times["deferred_init"][0],
        "gc_s": statistics.median(gc_seconds), "times": times, "cpu": cpu,
    }


def measure_ops(calls: int, repeats: int) -> list[dict[str, Any]]:
    """µs per call of :data:`OPS`, recorded and on meta (bench/recording.py's loops)."""
    from bench import recording

    rows = []
    for name in OPS:
        row: dict[str, Any] = {"op": name}
        for context in ("deferred_init", "meta"):
            row[context] = recording._time(recording.CONTEXTS[context], recording.OPS[name],
                                           calls, repeats, row)
        rows.append(row)
    return rows


def profile_top(n: int) -> str:
    """The ``n`` top functions by own time of one profiled ``deferred_init`` of the 70B Llama."""
    fn, args = build_fn(spec_named(MODEL))
    gc.collect()
    profiler = cProfile.Profile()
    profiler.enable()
    model = _build("deferred_init", fn, args)[0]
    profiler.disable()
    del model
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(n)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    root = str(Path(torch.__file__).parent.parent) + os.sep
    here = str(Path(__file__).resolve().parent.parent) + os.sep
    return "\n".join(line.replace(root, "").replace(here, "") for line in lines[start:] if line)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _source() -> str:
    """Where torchdefer was imported from (PYTHONPATH may point at another checkout)."""
    import torchdefer

    return str(Path(torchdefer.__file__).parent.parent)


def report(result: dict[str, Any]) -> str:
    c = result["construction"]
    lines = [
        "# Recording cost: `deferred_init` of the 70B Llama vs the meta device",
        "",
        f"Command: `{result['command']}` (commit {result['commit']}, torch {torch.__version__}, "
        f"Python {platform.python_version()}, {os.cpu_count()} cores, load "
        f"{result['load'][0]:.1f} at start, {result['load'][1]:.1f} at end; torchdefer "
        f"imported from `{result['source']}`).",
        "",
        *([result["note"], ""] if result.get("note") else []),
        "| measure | value | target |",
        "| --- | --- | --- |",
        f"| `deferred_init` / meta, {c['model']} (median of {c['runs']} alternated runs) | "
        f"{c['deferred_s']:.3f} s / {c['meta_s']:.3f} s = **{c['ratio']:.2f}x** | <= 3x |",
        f"| the same in CPU time (least of the runs: other processes disturb it less) | "
        f"{c['deferred_cpu_s']:.3f} s / {c['meta_cpu_s']:.3f} s = **{c['cpu_ratio']:.2f}x** | |",
        f"| recorded ops | {c['ops']} | |",
        f"| `deferred_init` µs per recorded op (wall, median; CPU, least) | "
        f"{c['us_per_op']:.1f}; {c['cpu_us_per_op']:.1f} | |",
        f"| first `deferred_init` of the process (it also builds the jump tables "
        f"for this model's draw count) | {c['first_deferred_s']:.3f} s | |",
        f"| of which the cyclic GC (median) | {c['gc_s'] * 1e3:.1f} ms | |",
        "",
        "Per run (s): meta " + ", ".join(f"{t:.3f}" for t in c["times"]["meta"])
        + "; deferred_init " + ", ".join(f"{t:.3f}" for t in c["times"]["deferred_init"]) + ".",
        "",
    ]
    if result.get("ops"):
        lines += ["## µs per call (best of loops, `bench/recording.py`)", "",
                  "| call | recorded ops/call | deferred_init µs | meta µs |",
                  "| --- | --- | --- | --- |"]
        for row in result["ops"]:
            d, m = (_us(row.get(c)) for c in ("deferred_init", "meta"))
            lines.append(f"| {row['op']} | {row.get('ops_per_call', 1):g} | {d} | {m} |")
        lines.append("")
    if result.get("profile"):
        lines += ["## Top functions by own time (cProfile, one `deferred_init` of the 70B Llama)",
                  "", "```", result["profile"], "```", ""]
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300, help="calls per µs/op loop (0: skip)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, help="top N functions (0: none)")
    parser.add_argument("--out", type=Path, default=None, help="write the report here")
    parser.add_argument("--name", default="recording_cost", help="file name of the report")
    parser.add_argument("--note", default="", help="a line for the report (how it was run)")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    start_load = os.getloadavg()[0]
    result: dict[str, Any] = {
        "command": "python bench/bench_recording_cost.py " + " ".join(argv or sys.argv[1:]),
        "commit": _commit(),
        "source": _source(),
        "note": options.note,
        "construction": measure_construction(options.runs),
    }
    if options.calls:
        result["ops"] = measure_ops(options.calls, options.repeats)
    if options.profile:
        result["profile"] = profile_top(options.profile)
    result["load"] = (start_load, os.getloadavg()[0])
    text = report(result)
    print(text)
    if options.out is not None:
        options.out.mkdir(parents=True, exist_ok=True)
        (options.out / f"{options.name}.md").write_text(text)
        (options.out / f"{options.name}.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
