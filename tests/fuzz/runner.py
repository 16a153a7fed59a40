"""Run many fuzz programs of one focus; count outcomes; shrink and print failures.

The profile comes from the environment, so the long run is one command:

    TORCHDEFER_FUZZ_PROGRAMS=10000 .venv/bin/python -m pytest tests/fuzz -q

``TORCHDEFER_FUZZ_PROGRAMS`` is the number of programs over all focuses (the
fast profile of ``make test`` runs ``FAST_PER_FOCUS`` per focus);
``TORCHDEFER_FUZZ_SEED`` picks the programs: seed ``S`` runs programs
``S * SEED_STRIDE + i``, so two seeds never share a program (seed 0 is the
fast profile's, programs ``0..n``); ``TORCHDEFER_FUZZ_REPORT`` names a
file that gets the stats and every shrunk reproduction. The fast profile stops
a focus at its first failure; the long one runs all its programs and shrinks
the first ``TORCHDEFER_FUZZ_SHRINK`` failures of each focus (default 8).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from differential import ORDERS, check, shrink, suspected_classes
from program import FOCUS, generate, render

__all__ = ["REPORTS", "FocusReport", "profile", "run_focus"]

FAST_PER_FOCUS = 16


@dataclass(slots=True)
class FocusReport:
    focus: str
    outcomes: Counter = field(default_factory=Counter)  # status -> count
    refusals: Counter = field(default_factory=Counter)  # error's first line -> count
    skips: Counter = field(default_factory=Counter)  # eager exception type -> count
    classes: Counter = field(default_factory=Counter)  # suspected class -> failures
    repros: list[str] = field(default_factory=list)  # shrunk, printable

    def summary(self) -> str:
        ran = sum(n for status, n in self.outcomes.items() if status != "failed, not shrunk")
        parts = [f"{self.focus}: {ran} programs"] + [
            f"{n} {status}" for status, n in sorted(self.outcomes.items())]
        lines = [", ".join(parts)]
        lines += [f"    refused {n}x: {msg}" for msg, n in self.refusals.most_common(6)]
        lines += [f"    shrunk failures {n}x, suspected class: {c}" for c, n in self.classes.most_common()]
        return "\n".join(lines)


REPORTS: list[FocusReport] = []

# Programs a seed owns. Before this stride, seed S ran programs S..S+n, so the
# seeds of consecutive runs (20261125, 20261126, ...) re-ran almost the same
# programs: a run of 10,000 with a "new" seed was mostly an old run.
SEED_STRIDE = 1_000_000


def profile() -> tuple[int, int, bool, int]:
    """(programs per focus, first seed, long profile?, failures to shrink per focus)."""
    total = os.environ.get("TORCHDEFER_FUZZ_PROGRAMS")
    seed = int(os.environ.get("TORCHDEFER_FUZZ_SEED", "0"))
    shrink_n = int(os.environ.get("TORCHDEFER_FUZZ_SHRINK", "8"))
    if total is None:
        return FAST_PER_FOCUS, seed, False, 1
    return max(1, -(-int(total) // len(FOCUS))), seed, True, shrink_n


def run_focus(focus: str) -> FocusReport:
    count, first_seed, long, shrink_n = profile()
    report = FocusReport(focus)
    REPORTS.append(report)
    start = first_seed * SEED_STRIDE
    for seed in range(start, start + count):
        program = generate(seed, focus)
        outcome = check(program, ORDERS)
        report.outcomes[outcome.status] += 1
        if outcome.status == "refused":
            report.refusals[outcome.detail] += 1
        elif outcome.status == "skipped":
            report.skips[outcome.detail.split(":")[0]] += 1
        elif outcome.status == "failed":
            if len(report.repros) >= shrink_n:
                report.outcomes["failed, not shrunk"] += 1
                continue
            program, outcome = shrink(program, outcome)
            report.repros.append(render(program, outcome.order, outcome.sequence, outcome.detail))
            for c in suspected_classes(program, outcome):
                report.classes[c] += 1
            if not long:
                break
    _write_report()
    return report


def _write_report() -> None:
    path = os.environ.get("TORCHDEFER_FUZZ_REPORT")
    if not path:
        return
    with open(path, "w") as f:
        for report in REPORTS:
            f.write(report.summary() + "\n")
        for report in REPORTS:
            for repro in report.repros:
                f.write(f"\n### {report.focus}\n{repro}\n")
