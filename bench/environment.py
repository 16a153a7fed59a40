"""The machine, the versions and the exact command, for the top of the report."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import psutil

__all__ = ["describe", "load"]

ROOT = Path(__file__).resolve().parent.parent
_PACKAGES = ("torch", "transformers", "torchdefer", "psutil", "networkx", "matplotlib")


def describe(argv: list[str]) -> dict[str, str]:
    """Key facts of this run, as ordered label -> text pairs."""
    memory = psutil.virtual_memory()
    versions = ", ".join(f"{name} {_version(name)}" for name in _PACKAGES)
    return {
        "Command": f"`{_command(argv)}` (from the repository root)",
        "Date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "Commit": _commit(),
        "Machine": (f"{_cpu()}, {psutil.cpu_count(logical=True)} logical cores, "
                    f"{memory.total / 2**30:.1f} GiB RAM, {platform.system()} "
                    f"{platform.release()}"),
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "Versions": versions,
        "Threads": f"torch intra-op threads: {_threads()}",
        "Load": load(),
    }


def load() -> str:
    """The 1-minute load average: other work on the machine moves the times."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "unknown"
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def _command(argv: list[str]) -> str:
    exe = Path(sys.executable)
    try:
        shown = str(exe.relative_to(ROOT))
    except ValueError:
        shown = str(exe)
    return shlex.join([shown, "-m", "bench", *argv])


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return out + (" (src/ has uncommitted changes)" if dirty else "")


def _threads() -> str:
    return os.environ.get("OMP_NUM_THREADS") or "default (one per core)"
