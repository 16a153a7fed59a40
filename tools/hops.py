"""Count the hops from ``materialize_module`` to replay (issue 22's measure).

Builds ``nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))`` with
``torchdefer.deferred_init``, then traces ``torchdefer.materialize_module`` on
it with ``sys.setprofile`` (and ``threading.setprofile``: replay may run on a
worker). Two counts, up to the first call into the replay engine (the file
that defines ``Replay``: ``materialize/_replay.py``, ``materialize/replay.py``
in older trees):

- the *walk*: every Python call into a torchdefer file, in call order, calls
  that returned included; consecutive calls in the same file are one stop.
- the *path*: the torchdefer frames on the stack when replay is entered, one
  stop per change of file: the hand-offs from the public call to replay.

For each: the stops, the distinct files, and the crossings between packages
(``materialize`` -> ``recorder`` and back)::

    PYTHONPATH=src python tools/hops.py [--all]

``--all`` also lists every stop after replay begins. Run it on two commits
(``git worktree add``) to compare them with one measure.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import threading
from pathlib import Path

import torch
from torch import nn

import torchdefer


def _package_file(filename: str, root: Path) -> str | None:
    try:
        return str(Path(filename).resolve().relative_to(root))
    except ValueError:
        return None


Stop = tuple[str, str]  # (file relative to the package, function)


def _squeeze(calls: list[Stop]) -> list[Stop]:
    return [c for i, c in enumerate(calls) if i == 0 or calls[i - 1][0] != c[0]]


def trace() -> tuple[list[Stop], list[Stop]]:
    """The walk (every stop, in order) and the path (the stack at replay's entry)."""
    root = Path(torchdefer.__file__).resolve().parent
    module = torchdefer.deferred_init(lambda: nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)))
    assert all(torchdefer.is_deferred(p) for p in module.parameters())
    calls: list[Stop] = []
    path: list[Stop] = []
    lock = threading.Lock()

    def profile(frame, event, arg):
        if event != "call" or path:
            return
        name = _package_file(frame.f_code.co_filename, root)
        if name is None:
            return
        with lock:
            calls.append((name, frame.f_code.co_name))
            if _is_replay(name) and not path:
                stack, f = [], frame
                while f is not None:
                    inner = _package_file(f.f_code.co_filename, root)
                    if inner is not None:
                        stack.append((inner, f.f_code.co_name))
                    f = f.f_back
                path.extend(_squeeze(stack[::-1]))

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        torchdefer.materialize_module(module)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    assert not any(torchdefer.is_deferred(p) for p in module.parameters())
    return _squeeze(calls), path


def _is_replay(name: str) -> bool:
    return name.endswith(("materialize/_replay.py", "materialize/replay.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true",
                        help="also list the stops after replay begins")
    args = parser.parse_args(argv)
    walk, path = trace()
    first = next((i for i, (name, _) in enumerate(walk) if _is_replay(name)), len(walk))
    print("walk:")
    for i, (name, func) in enumerate(walk if args.all else walk[: first + 1]):
        print(f"{i:3d} {name}:{func}")
    print("path (the stack when replay is entered):")
    for i, (name, func) in enumerate(path):
        print(f"{i:3d} {name}:{func}")
    print(f"torch {torch.__version__}")
    for label, stops in (("walk", walk[:first]), ("path", path[:-1])):
        crossings = sum(1 for (a, _), (b, _) in itertools.pairwise(stops)
                        if a.split("/")[0] != b.split("/")[0])
        print(f"{label}: {len(stops)} stops in {len(set(n for n, _ in stops))} files before "
              f"replay, {crossings} crossings between packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
