"""The parent side of a benchmark case: spawn the child, sample its RSS, show progress.

Children are forked by one ``python -m bench.worker --serve`` process (see
``worker.py``), started on first use and stopped by :meth:`Runner.close`. The
child's resident memory is sampled with psutil every few milliseconds
between its ``begin`` and ``stop`` events; the child also reports the
kernel's exact peak where Linux allows it (``memory.py``). A child that runs
past its time limit, or whose RSS passes the memory guard (so that a case that
does not fit cannot take the machine down), is killed and reported as such.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.worker import PREFIX

__all__ = ["Outcome", "Runner"]

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
GiB = 1 << 30


@dataclass(slots=True, kw_only=True)
class Outcome:
    """What one case gave: ``status`` is ok, failed, timeout or memory-guard."""

    case: dict[str, Any]
    status: str
    result: dict[str, Any] = field(default_factory=dict)
    wall: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def peak_growth(self) -> int:
        """Peak RSS above the baseline: the larger of the sampled and the exact peak."""
        r = self.result
        peak = max(r.get("sampled_peak") or 0, r.get("exact_peak") or 0)
        return max(peak - r["baseline"], 0)


class Runner:
    """Runs cases one at a time, each in a child forked by a worker server; prints progress."""

    def __init__(self, *, total: int, timeout: float, memory_limit: int,
                 interval: float = 0.005, heartbeat: float = 5.0) -> None:
        self.total = total
        self.done = 0
        self.timeout = timeout
        self.memory_limit = memory_limit
        self.interval = interval
        self.heartbeat = heartbeat
        self._server: subprocess.Popen | None = None
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._stderr: deque[str] = deque(maxlen=40)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker server (it exits when its stdin closes)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

    def run(self, case: dict[str, Any], label: str) -> Outcome:
        self.done += 1
        print(f"[{self.done}/{self.total}] {label} ...", flush=True)
        outcome = self._run(case)
        if outcome.ok:
            print(f"    done in {outcome.wall:.1f} s, peak RSS "
                  f"+{outcome.peak_growth / MiB:,.1f} MiB", flush=True)
        else:
            print(f"    {outcome.status.upper()} after {outcome.wall:.1f} s", flush=True)
            if outcome.error:
                print("    " + outcome.error.strip().replace("\n", "\n    "), flush=True)
        return outcome

    def _start_server(self) -> subprocess.Popen:
        if self._server is not None and self._server.poll() is None:
            return self._server
        self._events = queue.Queue()
        server = subprocess.Popen(
            [sys.executable, "-m", "bench.worker", "--serve"],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1,
        )
        threading.Thread(target=_read_events, args=(server.stdout, self._events),
                         daemon=True).start()
        threading.Thread(target=_read_tail, args=(server.stderr, self._stderr),
                         daemon=True).start()
        event = self._events.get(timeout=300)
        if event["event"] != "ready":
            raise RuntimeError(f"bench worker server did not start: {event}")
        self._server = server
        return server

    def _run(self, case: dict[str, Any]) -> Outcome:
        server = self._start_server()
        self._stderr.clear()
        server.stdin.write(json.dumps(case) + "\n")
        server.stdin.flush()
        watch = _Watch(case)
        outcome = None
        while outcome is None:
            outcome = self._step(watch, server)
            if outcome is None:
                time.sleep(self.interval)
        self._wait_exit(watch, server)
        if outcome.status == "failed" and not outcome.error:
            outcome.error = "".join(self._stderr) or "the child died without a word"
        return outcome

    def _step(self, watch: _Watch, server: subprocess.Popen) -> Outcome | None:
        """Sample the child's RSS once and handle new events; an Outcome once it is over."""
        now = time.monotonic()
        current = watch.sample()
        while not self._events.empty():
            event = self._events.get()
            outcome = watch.handle(event, now)
            if event["event"] == "exit":
                watch.exited = True
            if outcome is not None:
                return outcome
        if watch.exited or server.poll() is not None:
            return Outcome(case=watch.case, status="failed", wall=now - watch.start)
        if now - watch.start > self.timeout:
            watch.kill()
            return Outcome(case=watch.case, status="timeout", wall=now - watch.start,
                           error=f"killed after the {self.timeout:.0f} s limit")
        if current > self.memory_limit:
            watch.kill()
            return Outcome(case=watch.case, status="memory-guard", wall=now - watch.start,
                           error=f"killed at RSS {current / GiB:.1f} GiB, over the "
                                 f"{self.memory_limit / GiB:.1f} GiB guard")
        if now - watch.last_beat >= self.heartbeat:
            watch.last_beat = now
            print(f"    ... {now - watch.start:.0f} s, RSS {current / GiB:.2f} GiB", flush=True)
        return None

    def _wait_exit(self, watch: _Watch, server: subprocess.Popen) -> None:
        """Wait for the server to report the child gone, so cases never overlap."""
        deadline = time.monotonic() + 60
        while not watch.exited and time.monotonic() < deadline and server.poll() is None:
            try:
                event = self._events.get(timeout=0.5)
            except queue.Empty:
                continue
            watch.exited = event["event"] == "exit"
        if not watch.exited:
            server.kill()
            server.wait()
            self._server = None


class _Watch:
    """The state of one running case, as the parent sees it."""

    def __init__(self, case: dict[str, Any]) -> None:
        self.case = case
        self.start = self.last_beat = time.monotonic()
        self.proc: psutil.Process | None = None
        self.sampling = False
        self.sampled_peak = 0
        self.exited = False

    def sample(self) -> int:
        if self.proc is None:
            return 0
        try:
            current = self.proc.memory_info().rss
        except psutil.Error:
            return 0
        if self.sampling:
            self.sampled_peak = max(self.sampled_peak, current)
        return current

    def kill(self) -> None:
        if self.proc is not None:
            try:
                self.proc.kill()
            except psutil.Error:
                pass

    def handle(self, event: dict[str, Any], now: float) -> Outcome | None:
        kind = event["event"]
        if kind == "pid":
            self.proc = psutil.Process(event["pid"])
        elif kind == "begin":
            self.sampling, self.sampled_peak = True, max(event["rss"], self.sample())
        elif kind == "stop":
            self.sampling = False
        elif kind == "progress":
            print(f"    {event['text']}", flush=True)
        elif kind == "end":
            result = event["result"]
            result["sampled_peak"] = self.sampled_peak or None
            return Outcome(case=self.case, status="ok", result=result, wall=now - self.start)
        elif kind == "error":
            return Outcome(case=self.case, status="failed", error=event["error"],
                           wall=now - self.start)
        elif kind == "exit" and event["code"] != 0:
            return Outcome(case=self.case, status="failed", wall=now - self.start,
                           error=f"the child exited with code {event['code']} (a negative "
                                 "code is the signal that killed it; -9 may be the OOM killer)")
        return None


def _read_events(stream, events: queue.Queue) -> None:
    for line in stream:
        if line.startswith(PREFIX):
            events.put(json.loads(line[len(PREFIX):]))
        else:
            sys.stdout.write("    | " + line)


def _read_tail(stream, tail: deque) -> None:
    for line in stream:
        tail.append(line)
