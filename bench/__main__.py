"""``python -m bench [--quick] [--out DIR]``: run the suites, write the report and plots."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.environment import describe, load
from bench.models import GiB, ModelSpec, specs
from bench.runner import Outcome, Runner

__all__ = ["Plan", "main"]


@dataclass(slots=True, kw_only=True)
class Plan:
    """Which cases a run makes."""

    construction: list[str]
    materialization: list[str]  # must be eager-buildable here
    sweep: list[str] = field(default_factory=list)  # depths of one shape: time vs ops
    pairs: int = 2  # eager / materialize_module runs, alternated
    recording_n: int = 1000
    recording_repeats: int = 3
    repeats: int = 3
    timeout: float = 1800.0

    @staticmethod
    def full() -> Plan:
        return Plan(
            construction=["llama-125m", "llama-350m", "llama-1b", "llama-3b", "llama-8b",
                          "llama-70b", "llama-405b", "stack-1t"],
            materialization=["llama-125m", "llama-350m", "llama-1b"],
            sweep=[f"llama-70b-L{n}" for n in (10, 20, 40, 80, 160, 320)],
        )

    @staticmethod
    def quick() -> Plan:
        return Plan(construction=["llama-tiny", "llama-70b", "stack-1t"],
                    materialization=["llama-tiny"], pairs=1, recording_n=100,
                    recording_repeats=2, repeats=2, timeout=300.0)


def eager_fits(spec: ModelSpec, total: int) -> bool:
    """Whether eager fp32 construction fits: weights, 10% slack, 2 GiB of process, in 75%."""
    return spec.nbytes * 1.1 + 2 * GiB <= 0.75 * total


def cases(plan: Plan, total_memory: int) -> list[tuple[str, dict[str, Any], str]]:
    """``(suite, case, label)`` for every case of the plan, in run order."""
    out = []
    for spec in specs(plan.construction):
        methods = ["deferred_init", "meta", "meta+init", "FakeTensorMode"]
        if spec.family == "stack":
            methods.remove("meta+init")  # no init pass to skip: same as meta
        if eager_fits(spec, total_memory):
            methods.append("eager")
        for method in methods:
            case = {"suite": "construction", "model": spec.name, "method": method,
                    "repeats": plan.repeats}
            out.append(("construction", case, f"construct {spec.name} with {method}"))
    for spec in specs(plan.sweep):
        for method in ("deferred_init", "meta+init"):
            case = {"suite": "construction", "model": spec.name, "method": method,
                    "repeats": plan.repeats}
            out.append(("sweep", case, f"construct {spec.name} with {method}"))
    for spec in specs(plan.materialization):
        if not eager_fits(spec, total_memory):
            continue
        modes = ["eager", "materialize_module"] * plan.pairs + ["reverse tensors",
                                                                "per submodule"]
        for mode in modes:
            case = {"suite": "materialization", "model": spec.name, "mode": mode}
            out.append(("materialization", case, f"materialize {spec.name}: {mode}"))
    case = {"suite": "recording", "n": plan.recording_n, "repeats": plan.recording_repeats}
    out.append(("recording", case, "per-op recording overhead"))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="small models only: a smoke run in under two minutes")
    parser.add_argument("--out", type=Path, default=Path("bench/results"),
                        help="where results.md, results.json and the plots go")
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan.full()
    total = psutil.virtual_memory().total
    todo = cases(plan, total)
    env = describe(argv)
    print(f"torchdefer bench: {len(todo)} cases, each in its own process; "
          f"results to {args.out}/", flush=True)
    start = time.monotonic()
    outcomes: dict[str, list[Outcome]] = {}
    with Runner(total=len(todo), timeout=plan.timeout, memory_limit=int(0.9 * total)) as runner:
        for suite, case, label in todo:
            outcomes.setdefault(suite, []).append(runner.run(case, label))
    env["Duration"] = f"{time.monotonic() - start:.0f} s for {len(todo)} cases"
    env["Load"] = f"at start: {env['Load']}; at end: {load()}"
    args.out.mkdir(parents=True, exist_ok=True)
    raw = {"environment": env, "quick": args.quick,
           "outcomes": {s: [_raw(o) for o in os] for s, os in outcomes.items()}}
    (args.out / "results.json").write_text(json.dumps(raw, indent=1) + "\n")
    from bench.plots import write_plots
    from bench.report import write_report

    plots = write_plots(outcomes, args.out)
    path = write_report(env, outcomes, plots, args.out, quick=args.quick)
    failed = [o for os in outcomes.values() for o in os if not o.ok]
    print(f"wrote {path}" + (f"; {len(failed)} case(s) did not finish" if failed else ""))
    return 1 if failed else 0


def _raw(outcome: Outcome) -> dict[str, Any]:
    return {"case": outcome.case, "status": outcome.status, "wall": outcome.wall,
            "error": outcome.error, "result": outcome.result}


if __name__ == "__main__":
    sys.exit(main())
