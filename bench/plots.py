"""PNG plots of the results, with matplotlib when it is installed.

matplotlib is an optional bench dependency (``pip install matplotlib``, or
``make bench`` installs it); without it the report says the plots were
skipped and everything else is written as usual.
"""

from __future__ import annotations

from pathlib import Path

from bench.report import METHOD_ORDER, linear_fit
from bench.runner import Outcome

__all__ = ["write_plots"]

MiB = 1 << 20


def write_plots(outcomes: dict[str, list[Outcome]], out: Path) -> list[Path] | str:
    """Write the PNGs into ``out``; returns their paths, or a note if none could be made."""
    try:
        import matplotlib
    except ImportError:
        return ("Plots skipped: matplotlib is not installed (`pip install matplotlib`, "
                "or run `make bench`, which installs it).")
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    paths = []
    construction = [o for o in outcomes.get("construction", []) if o.ok]
    sweep = [o for o in outcomes.get("sweep", []) if o.ok]
    for name, draw, data in (
        ("construction_time", _construction_time, construction),
        ("construction_memory", _construction_memory, construction),
        ("time_vs_ops", _time_vs_ops, construction + sweep),
        ("materialization_steps", _steps, outcomes.get("materialization", [])),
        ("recording_overhead", _recording, outcomes.get("recording", [])),
    ):
        fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
        if draw(ax, [o for o in data if o.ok]):
            fig.tight_layout()
            path = out / f"{name}.png"
            fig.savefig(path)
            paths.append(path)
        plt.close(fig)
    return paths


def _by_method(outcomes: list[Outcome]):
    for method in METHOD_ORDER:
        pts = sorted((o.result["params"], o) for o in outcomes
                     if o.case["method"] == method and "params" in o.result)
        if pts:
            yield method, [p[0] for p in pts], [p[1] for p in pts]


def _construction_time(ax, outcomes: list[Outcome]) -> bool:
    for method, params, os in _by_method(outcomes):
        ax.plot(params, [o.result["seconds"] for o in os], "o-", label=method)
    ax.set(xscale="log", yscale="log", xlabel="parameters", ylabel="construction time (s)",
           title="Construction time against model size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return bool(outcomes)


def _construction_memory(ax, outcomes: list[Outcome]) -> bool:
    for method, params, os in _by_method(outcomes):
        ax.plot(params, [max(o.peak_growth, 1) / MiB for o in os], "o-", label=method)
    ax.axhline(64, color="grey", linestyle=":", label="64 MiB target")
    ax.set(xscale="log", yscale="log", xlabel="parameters",
           ylabel="peak RSS above baseline (MiB)", title="Construction peak memory")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return bool(outcomes)


def _time_vs_ops(ax, outcomes: list[Outcome]) -> bool:
    pts = sorted((o.result["ops"], o.result["seconds"], o.case["model"]) for o in outcomes
                 if o.case["method"] == "deferred_init" and "ops" in o.result)
    if len(pts) < 2:
        return False
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    ax.plot(xs, ys, "o", label="deferred_init")
    a, b, r2 = linear_fit(xs, ys)
    ax.plot([0, max(xs)], [a, a + b * max(xs)], "-", alpha=0.6,
            label=f"fit: {b * 1e6:.0f} µs/op, r²={r2:.3f}")
    for x, y, name in pts:
        ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set(xlabel="recorded ops", ylabel="deferred_init time (s)",
           title="deferred_init time against recorded ops")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return True


def _steps(ax, outcomes: list[Outcome]) -> bool:
    stepwise = [o for o in outcomes if "steps" in o.result]
    if not stepwise:
        return False
    biggest = max(stepwise, key=lambda o: o.result["steps"][-1]["done"]).case["model"]
    top = 0.0
    for o in stepwise:
        if o.case["model"] != biggest:
            continue
        done = [s["done"] / MiB for s in o.result["steps"]]
        peak = [s["peak"] / MiB for s in o.result["steps"]]
        ax.plot(done, peak, ".-", label=f"{o.case['model']}: {o.case['mode']} (step peak)")
        top = max(top, *done)
    ax.plot([0, top], [0, top], "k:", label="ideal: materialized so far")
    ax.set(xlabel="materialized so far (MiB)", ylabel="step peak RSS above start (MiB)",
           title="Stepwise materialization: peak memory per step")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return True


def _recording(ax, outcomes: list[Outcome]) -> bool:
    if not outcomes:
        return False
    rows = outcomes[0].result["rows"]
    contexts = ("deferred_init", "meta", "FakeTensorMode")
    width = 0.27
    for k, context in enumerate(contexts):
        values = [row[context] or 0 for row in rows]
        ax.barh([i + (k - 1) * width for i in range(len(rows))], values, height=width,
                label=context)
    ax.set_yticks(range(len(rows)), [row["op"] for row in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set(xscale="log", xlabel="µs per call (log)", title="Per-call cost of common init ops")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return True
