"""Why an export failed, written in the descriptors' names with the model's line.

Export reports a contradiction as "Constraints violated (b)" with its own
symbols (``s77``). The ShapeEnv we gave it (``compat.export_tracing``) keeps
a record per guard: the condition and the line that added it. Symbols are
renamed through their sources (input ``x``, dim 1 -> ``'b'``); guards that
hold for every length the descriptors allow (``Eq(Mod(b*t, b), 0)``) are left
out, found by trying sample lengths in range. A failure that is not a
contradiction (an exception while tracing) names the innermost model frame.
"""

from __future__ import annotations

import linecache
import random
import re
import traceback
from collections.abc import Mapping
from typing import Any

import sympy

from torchdefer._compat import export as compat
from torchdefer.descriptors._checker import show_key
from torchdefer.fake._source import is_library_code

__all__ = ["conflict"]

_SAMPLES = (2, 3, 4, 5, 7, 8, 16, 31, 64, 97, 128, 1000)
_FIX = ("  Fix the code, or describe the dimension with the length it needs "
        "(a static int or a narrower dim_ranges).")


def conflict(error: Exception, shape_env: Any, plan: Any, qualname: str) -> tuple[str, list[str]]:
    """The message and dims of a ``DescriptorConflict`` for what ``torch.export``
    raised, traced with ``shape_env`` on ``plan`` (input names, inputs, example
    sizes, ranges)."""
    display: dict[str, str] = {}  # export symbol -> descriptor name
    bounds: dict[str, tuple[int, int | None]] = {}  # descriptor name of a tensor dim -> range
    inputs = dict(zip(plan.names, plan.inputs))
    for symbol, (name, dim) in compat.symbol_sources(shape_env).items():
        if name in inputs:
            path, _, keys = inputs[name]
            key = (path,) if dim is None else keys.get(dim, (path, dim))
            display[symbol.name] = show_key(key)
            if dim is not None:
                bounds[display[symbol.name]] = plan.ranges.get(key, (0, None))
    if compat.is_constraint_violation(error):
        return _violation(error, shape_env, display, bounds, qualname)
    frames = [(f.f_code, line) for f, line in traceback.walk_tb(error.__traceback__)
              if not is_library_code(f.f_code)]
    where = _line(frames[-1][0].co_filename, frames[-1][1], frames[-1][0].co_name) if frames else (
        "<no user frame>")
    first = (str(error).strip().splitlines() or [""])[0]
    symbols = set(re.findall(r"\b[su]\d+\b", first))
    text = re.sub(r"\b[su]\d+\b", lambda m: display.get(m.group(0), m.group(0)), first)
    hints = ", ".join(f"{show_key(k)}={v}" for k, v in plan.hints.items()) or "none"
    message = (f"{qualname}: tracing with the input descriptors failed at {where}\n"
               f"  {type(error).__name__}: {text}\n  (example lengths used: {hints}). If the "
               "code needs particular lengths, describe them statically or narrow dim_ranges.")
    return message, sorted({display[s] for s in symbols if display.get(s) in bounds})


def _violation(error: Exception, shape_env: Any, display: Mapping[str, str],
               bounds: Mapping[str, tuple[int, int | None]],
               qualname: str) -> tuple[str, list[str]]:
    guards = [g for g in shape_env.guards if _restricts(g.expr, display, bounds)]
    dims = sorted({display[s.name] for g in guards for s in g.expr.free_symbols
                   if display.get(s.name) in bounds})
    lines = [f"{qualname}: the model's code contradicts the input descriptors."]
    if dims:
        names = ", ".join(map(repr, dims))
        verb = "is" if len(dims) == 1 else "are"
        lines.append(f"  {names} {verb} described as symbolic, but the code requires:")
    for g in guards:
        renamed = g.expr.xreplace({s: sympy.Symbol(display[s.name])
                                   for s in g.expr.free_symbols if s.name in display})
        loc = g.sloc.framework_loc
        where = _line(loc.filename, loc.lineno, loc.name) if hasattr(loc, "lineno") else str(loc)
        lines.append(f"    {renamed}  at {where}")
    if not dims:
        lines.append("  " + str(error).splitlines()[0])
    return "\n".join([*lines, _FIX]), dims


def _restricts(expr: Any, display: Mapping[str, str],
               bounds: Mapping[str, tuple[int, int | None]]) -> bool:
    """Whether a guard excludes lengths the descriptors allow: tried on sample
    lengths in range, one per descriptor name, all equal first, then at random."""
    shown = {s: display.get(s.name, s.name) for s in expr.free_symbols}
    if not any(d in bounds for d in shown.values()):
        return False
    rng = random.Random(0)
    for attempt in range(len(_SAMPLES) + 32):
        pick: dict[str, int] = {}
        for name in shown.values():
            lo, hi = bounds.get(name, (2, None))
            allowed = [v for v in _SAMPLES if max(lo, 2) <= v <= (hi or v)] or [max(lo, 2)]
            pick[name] = (allowed[attempt % len(allowed)] if attempt < len(_SAMPLES)
                          else rng.choice(allowed))
        if compat.evaluate(expr, {s: pick[d] for s, d in shown.items()}) is not True:
            return True
    return False


def _line(filename: str, lineno: int, name: str) -> str:
    source = linecache.getline(filename, lineno).strip()
    return f"{filename}:{lineno} in {name}" + (f": {source}" if source else "")
