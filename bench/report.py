"""The Markdown report: environment, targets with measured values, one table per suite."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from bench.runner import Outcome

__all__ = ["linear_fit", "write_report"]

MiB = 1 << 20
METHOD_ORDER = ("deferred_init", "meta", "meta+init", "FakeTensorMode", "eager")


def write_report(env: dict[str, str], outcomes: dict[str, list[Outcome]],
                 plots: list[Path] | str, out: Path, *, quick: bool) -> Path:
    """Write ``out/results.md``; returns its path."""
    lines = ["# torchdefer benchmarks" + (" (quick smoke run)" if quick else ""), ""]
    lines += [f"- **{k}**: {v}" for k, v in env.items()]
    lines += ["", "Each case ran in a fresh child process. *Peak RSS* is the highest "
              "resident memory above the child's baseline (taken after imports and a "
              "warm-up), the larger of psutil sampling every 5 ms and the kernel's exact "
              "high-water mark. Times are wall-clock, median of up to 3 repeats for "
              "cases under 2 s. See `bench/README.md` for the method.", ""]
    construction = outcomes.get("construction", [])
    sweep = outcomes.get("sweep", [])
    materialization = outcomes.get("materialization", [])
    lines += _targets(construction, sweep, materialization)
    lines += _construction(construction, sweep)
    lines += _materialization(materialization)
    lines += _recording(outcomes.get("recording", []))
    lines += _failures(outcomes)
    lines += ["## Plots", ""]
    if isinstance(plots, str):
        lines += [plots, ""]
    else:
        lines += [f"![{p.stem}]({p.name})" for p in plots] + [""]
    path = out / "results.md"
    path.write_text("\n".join(lines))
    return path


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def _find(outcomes: list[Outcome], **match: Any) -> Outcome | None:
    for o in outcomes:
        if o.ok and all(o.case.get(k) == v for k, v in match.items()):
            return o
    return None


def _mib(n: float | None) -> str:
    return "—" if n is None else f"{n / MiB:,.1f}"


def _params(n: int) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def _seconds(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s:.3f}" if s < 10 else f"{s:.1f}"


def _verdict(ok: bool | None) -> str:
    return "—" if ok is None else ("met" if ok else "**missed**")


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares ``y = a + b x``: returns (a, b, r²)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    b = sxy / sxx if sxx else 0.0
    r2 = (sxy * sxy / (sxx * syy)) if sxx and syy else 1.0
    return my - b * mx, b, r2


def _deferred_points(construction, sweep) -> list[tuple[int, float, str, float]]:
    """``(ops, seconds, model, seconds of full GC passes in it)`` of each deferred_init case."""
    points = []
    for o in [*construction, *sweep]:
        if o.ok and o.case["method"] == "deferred_init" and "ops" in o.result:
            points.append((o.result["ops"], o.result["seconds"], o.case["model"],
                           o.result.get("full_gc_seconds", 0.0)))
    return sorted(points)


def _targets(construction, sweep, materialization) -> list[str]:
    rows = []
    big = "llama-70b"
    deferred = _find(construction, model=big, method="deferred_init")
    meta = _find(construction, model=big, method="meta")
    meta_init = _find(construction, model=big, method="meta+init")
    if deferred and meta:
        ratio = deferred.result["seconds"] / meta.result["seconds"]
        extra = ""
        if meta_init:
            extra = (f"; vs meta+init (the same init ops on meta): "
                     f"{deferred.result['seconds'] / meta_init.result['seconds']:.2f}x")
        rows.append(["`deferred_init` 70B time ≤ 10x meta device",
                     f"{ratio:.1f}x ({_seconds(deferred.result['seconds'])} s vs "
                     f"{_seconds(meta.result['seconds'])} s){extra}", _verdict(ratio <= 10)])
    if deferred:
        growth = deferred.peak_growth
        rows.append(["`deferred_init` 70B peak RSS growth ≤ 64 MiB",
                     f"{_mib(growth)} MiB ({deferred.result['ops']} ops)",
                     _verdict(growth <= 64 * MiB)])
    points = _deferred_points([], sweep) or _deferred_points(construction, [])
    if len(points) >= 3:
        # Less the collector's full passes: a fixed step where the process's
        # object count starts one, not a cost per op (bench/construction.py).
        _, b, r2 = linear_fit([p[0] for p in points], [p[1] - p[3] for p in points])
        _, _, raw = linear_fit([p[0] for p in points], [p[1] for p in points])
        per_op = [(p[1] - p[3]) / p[0] * 1e6 for p in points]
        passes = sum(p[3] for p in points)
        rows.append(["`deferred_init` time linear in recorded ops (r² ≥ 0.98)",
                     f"r² = {r2:.4f} over {len(points)} depths, {b * 1e6:.0f} µs/op "
                     f"(per case {min(per_op):.0f}-{max(per_op):.0f} µs/op), less the "
                     f"cyclic GC's full passes ({passes:.2f} s in all); with them r² = {raw:.4f}",
                     _verdict(r2 >= 0.98)])
    for model in dict.fromkeys(o.case["model"] for o in materialization):
        mm = _summary(materialization, model, "materialize_module")
        eager = _summary(materialization, model, "eager")
        if not (mm and eager):
            continue
        t = mm["seconds"] / eager["seconds"]
        m = mm["peak"] / max(eager["peak"], 1)
        runs = f"median of {mm['runs']} runs each, alternated"
        rows.append([f"`materialize_module` {model} time ≤ 1.10x eager",
                     f"{t:.2f}x ({_seconds(mm['seconds'])} s vs "
                     f"{_seconds(eager['seconds'])} s, {runs})", _verdict(t <= 1.10)])
        rows.append([f"`materialize_module` {model} peak RSS ≤ 1.05x eager",
                     f"{m:.3f}x ({_mib(mm['peak'])} vs {_mib(eager['peak'])} MiB)",
                     _verdict(m <= 1.05)])
    return ["## Targets", "", *_table(["target", "measured", "verdict"], rows)]


def _construction(construction, sweep) -> list[str]:
    rows = []
    for o in sorted(construction, key=lambda o: (o.result.get("params", 0),
                                                 _order(o.case["method"]))):
        r = o.result
        if not o.ok:
            rows.append([o.case["model"], "", o.case["method"], o.status, "", "", "", "", ""])
            continue
        ops, graph = r.get("ops"), r.get("graph_bytes")
        rows.append([o.case["model"], _params(r["params"]), o.case["method"],
                     _seconds(r["seconds"]), _mib(o.peak_growth), _mib(r["retained"]),
                     ops or "", _mib(graph) if graph else "",
                     f"{graph / ops:,.0f}" if graph and ops else ""])
    lines = ["## 1. Construction", "",
             "Peak RSS and retained RSS in MiB above the baseline; *graph* is what the "
             "recorded graph holds, walked object by object (`graph_nbytes`).", ""]
    lines += _table(["model", "params", "method", "time (s)", "peak RSS", "retained",
                     "recorded ops", "graph (MiB)", "graph bytes/op"], rows)
    lines += _growth(construction)
    if sweep:
        rows = []
        for o in sweep:
            if o.ok:
                rows.append([o.case["model"], o.case["method"], o.result.get("ops", ""),
                             _seconds(o.result["seconds"]),
                             _seconds(o.result.get("full_gc_seconds", 0.0)),
                             _mib(o.peak_growth)])
        points = _deferred_points([], sweep)
        lines += ["### Time against recorded ops", "",
                  "The llama-70b shape at several depths (same tensor sizes, more layers). "
                  "Full GC: the time of the cyclic garbage collector's full passes inside "
                  "the build (each scans every object of the process; one starts once "
                  "enough new objects have lived long: a recording keeps ~9 per op).", ""]
        lines += _table(["model", "method", "recorded ops", "time (s)", "of it full GC (s)",
                         "peak RSS (MiB)"], rows)
        if len(points) >= 2:
            a, b, r2 = linear_fit([p[0] for p in points], [p[1] - p[3] for p in points])
            _, raw_b, raw = linear_fit([p[0] for p in points], [p[1] for p in points])
            lines += [f"Least-squares fit for `deferred_init`, less the full GC passes: time = "
                      f"{a * 1e3:.1f} ms + {b * 1e6:.1f} µs x ops, r² = {r2:.4f} (with them: "
                      f"{raw_b * 1e6:.1f} µs x ops, r² = {raw:.4f}).", ""]
    return lines


def _order(method: str) -> int:
    return METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)


def _growth(construction) -> list[str]:
    """Log-log slopes of time and peak RSS against parameter count, per method."""
    rows = []
    for method in METHOD_ORDER:
        pts = [(o.result["params"], o.result["seconds"], o.peak_growth)
               for o in construction if o.ok and o.case["method"] == method
               and o.case["model"].startswith("llama")]
        if len(pts) < 2:
            continue
        logs = [math.log(p[0]) for p in pts]
        _, t_slope, _ = linear_fit(logs, [math.log(p[1]) for p in pts])
        mem = [(x, math.log(p[2])) for x, p in zip(logs, pts) if p[2] > 0]
        m_slope = linear_fit([m[0] for m in mem], [m[1] for m in mem])[1] if len(mem) > 1 else None
        rows.append([method, len(pts), f"{t_slope:.2f}",
                     "—" if m_slope is None else f"{m_slope:.2f}"])
    if not rows:
        return []
    return ["How cost grows with model size over the Llama shapes: the exponent k in "
            "cost ∝ params^k (1 = proportional to the weights, 0 = flat).", "",
            *_table(["method", "models", "time exponent", "peak RSS exponent"], rows)]


def _summary(outcomes: list[Outcome], model: str, mode: str) -> dict[str, Any] | None:
    """Medians of time and peak over the runs of one mode, and whether all match eager."""
    runs = [o for o in outcomes if o.ok and o.case["model"] == model and o.case["mode"] == mode]
    if not runs:
        return None
    init = [o.result["init_seconds"] for o in runs if o.result.get("init_seconds") is not None]
    return {"runs": len(runs), "seconds": statistics.median(o.result["seconds"] for o in runs),
            "peak": statistics.median(o.peak_growth for o in runs),
            "init": statistics.median(init) if init else None,
            "fingerprints": {o.result["fingerprint"] for o in runs}}


def _materialization(materialization) -> list[str]:
    if not materialization:
        return []
    rows = []
    models = dict.fromkeys(o.case["model"] for o in materialization)
    for model in models:
        eager = _summary(materialization, model, "eager")
        for mode in dict.fromkeys(o.case["mode"] for o in materialization):
            m = _summary(materialization, model, mode)
            if m is None:
                rows.append([model, mode, "did not finish"] + [""] * 6)
                continue
            same = "—" if eager is None else (
                "yes" if m["fingerprints"] | eager["fingerprints"] == eager["fingerprints"]
                and len(eager["fingerprints"]) == 1 else "**NO**")
            rows.append([
                model, mode, m["runs"], _seconds(m["init"]), _seconds(m["seconds"]),
                f"{m['seconds'] / eager['seconds']:.2f}x" if eager else "—",
                _mib(m["peak"]), f"{m['peak'] / eager['peak']:.3f}x" if eager else "—", same])
    lines = ["## 2. Materialization on CPU", "",
             "Medians over the runs. Time of the materialization alone (the "
             "`deferred_init` before it is listed apart); peak RSS counts the graph as "
             "well (the window opens before `deferred_init`). Ratios are against the "
             "`eager` rows. *bitwise* compares a fingerprint of every weight with the eager "
             "build's.", ""]
    lines += _table(["model", "mode", "runs", "deferred_init (s)", "time (s)", "time ratio",
                     "peak RSS (MiB)", "peak ratio", "bitwise = eager"], rows)
    steps = [o for o in materialization if o.ok and "steps" in o.result]
    if steps:
        rows = [[o.case["model"], o.case["mode"], len(o.result["steps"]),
                 _mib(o.result["largest_step"]), _mib(o.result["max_excess"]),
                 o.result["max_excess_at"],
                 f"{o.result['max_excess'] / o.result['largest_step']:.2f}"] for o in steps]
        lines += ["Step by step: *excess* is a step's peak minus everything materialized so "
                  "far (this step included) — the memory beyond the ideal. Near one unit "
                  "plus what is materialized means excess ≤ the largest unit (ratio ≤ 1).", ""]
        lines += _table(["model", "mode", "steps", "largest unit (MiB)", "max excess (MiB)",
                         "at", "excess / largest unit"], rows)
    return lines


def _recording(recording) -> list[str]:
    o = next((o for o in recording if o.ok), None)
    if o is None:
        return []
    rows = []
    for row in o.result["rows"]:
        d, m, f = row["deferred_init"], row["meta"], row["FakeTensorMode"]
        ops = row.get("ops_per_call")
        rows.append([row["op"], f"{ops:g}" if ops else "—", _us(d),
                     _us(d / ops) if d is not None and ops else "—", _us(m), _us(f),
                     _ratio(d, m), _ratio(d, f)])
    errors = [f"- {row['op']}: {c} cannot run it ({e})"
              for row in o.result["rows"] for c, e in row.get("errors", {}).items()]
    lines = ["## 3. Per-op recording overhead", "",
             f"µs per call, best of {o.result['repeats']} loops of {o.result['n']} calls "
             "(fewer for ops that compute), on a 1024x1024 fp32 tensor.", ""]
    lines += _table(["call", "recorded ops/call", "deferred_init µs", "µs per recorded op",
                     "meta µs", "FakeTensorMode µs", "÷ meta", "÷ FakeTensorMode"], rows)
    return lines + ([*errors, ""] if errors else [])


def _us(v: float | None) -> str:
    return "cannot run" if v is None else f"{v:,.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or not b else f"{a / b:.1f}x"


def _failures(outcomes) -> list[str]:
    failed = [o for os in outcomes.values() for o in os if not o.ok]
    if not failed:
        return []
    lines = ["## Cases that did not finish", ""]
    for o in failed:
        first = o.error.strip().splitlines()[-1] if o.error.strip() else ""
        lines.append(f"- {o.case}: {o.status} after {o.wall:.0f} s. {first}")
    return [*lines, ""]
