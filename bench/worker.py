"""The child side of a benchmark case.

A case runs alone in a fresh process so that what one case allocates, caches
or leaks cannot move another's numbers. ``python -m bench.worker --serve``
imports torch, transformers and torchdefer once and forks one child per case
line read from stdin (``python -m bench.worker '<case as JSON>'`` runs one
case in the current process, for debugging). The child talks to the parent in
JSON lines on stdout prefixed with ``@bench``::

    pid       the child's process id: the one whose RSS to sample
    begin     baseline RSS taken; the parent starts its sampled peak here
    progress  a line to show while a long case runs
    stop      the measured window ends (checks such as fingerprints follow)
    end       the result: a JSON object, the suite's own fields
    error     a traceback; the case failed
    exit      (from the server) the child is gone, with its exit code

Any other output (library warnings) passes through untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

from bench.memory import PeakMeter, rss

__all__ = ["Probe", "run", "serve"]

PREFIX = "@bench "


class Probe:
    """Times phases and reads their exact peak RSS; reports to the parent."""

    def __init__(self) -> None:
        self.meter = PeakMeter()
        self.baseline = 0
        self.phases: dict[str, dict[str, Any]] = {}
        self.window_peak = 0

    def emit(self, event: str, **fields: Any) -> None:
        self.emit_static(event, **fields)

    @staticmethod
    def emit_static(event: str, **fields: Any) -> None:
        print(PREFIX + json.dumps({"event": event, **fields}), flush=True)

    def begin(self) -> int:
        """Start the measured window; returns the baseline RSS."""
        self.baseline = self.meter.reset()
        self.window_peak = self.baseline
        self.emit("begin", rss=self.baseline, exact_peak=self.meter.exact)
        return self.baseline

    def progress(self, text: str) -> None:
        self.emit("progress", text=text)

    @contextlib.contextmanager
    def measure(self, name: str, collect: bool = True) -> Iterator[dict[str, Any]]:
        """Time the block and record its peak RSS (exact where the kernel tells).

        ``collect=False`` skips the garbage collection before the block (for
        many short steps, where it would cost more than the step).
        """
        start_rss = self.meter.reset(collect)
        record: dict[str, Any] = {"rss_start": start_rss}
        start = time.perf_counter()
        yield record
        record["seconds"] = time.perf_counter() - start
        record["rss_end"] = rss()
        peak = self.meter.peak()
        record["peak"] = max(peak or 0, record["rss_end"], start_rss)
        self.window_peak = max(self.window_peak, record["peak"])
        self.phases[name] = record

    def stop(self) -> None:
        """End the measured window (the parent stops sampling the peak)."""
        self.emit("stop")

    def end(self, result: dict[str, Any]) -> None:
        result.setdefault("baseline", self.baseline)
        result.setdefault("exact_peak", self.window_peak if self.meter.exact else None)
        result.setdefault("phases", self.phases)
        self.emit("end", result=result)


def run(case: dict[str, Any]) -> int:
    """Run one case in this process, reporting to stdout; returns the exit code."""
    probe = Probe()
    probe.emit("pid", pid=os.getpid())
    try:
        result = _suite(case["suite"])(case, probe)
    except BaseException:
        probe.emit("error", error=traceback.format_exc())
        return 1
    probe.end(result)
    return 0


def serve() -> None:
    """Import the heavy modules once, then fork a fresh child for each case read from stdin.

    The child starts from this process as it is after the imports (nothing has
    run yet: no tensor, no thread pool), so a case pays neither the seconds of
    importing torch and transformers nor anything another case did.
    """
    import torch  # noqa: F401
    import transformers

    import torchdefer  # noqa: F401

    _ = transformers.LlamaForCausalLM, transformers.LlamaConfig  # resolve the lazy imports
    Probe().emit("ready", pid=os.getpid())
    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = run(case)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        Probe.emit_static("exit", code=os.waitstatus_to_exitcode(status))


def _suite(name: str):
    if name == "construction":
        from bench.construction import run_case
    elif name == "materialization":
        from bench.materialization import run_case
    elif name == "recording":
        from bench.recording import run_case
    else:
        raise ValueError(f"unknown bench suite {name!r}")
    return run_case


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        sys.exit(run(json.loads(sys.argv[1])))
