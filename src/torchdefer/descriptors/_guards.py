"""Capture the shape guards ``torch.export`` adds, with the user's source line.

``torch.export`` reports a descriptor contradiction ("you marked b as dynamic
but your code specialized it to be a constant (3)") without saying which line
of the model did it. ShapeEnv logs every guard it adds on the
``torch.fx.experimental.symbolic_shapes`` logger while the guard is being
added, i.e. with the user's frame still on the Python stack; a handler that
looks at the stack at that moment recovers the full file, line and code.
"""

from __future__ import annotations

import linecache
import logging
import os
import re
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = ["GuardLog", "capture_guards", "user_frame"]

_LOGGER = "torch.fx.experimental.symbolic_shapes"
_GUARD = re.compile(r"^eval (.+?) \[guard added\]")
_SYMBOL = re.compile(r"^create_symbol (\w+) = .*? for (.+?) \[")
# Frames inside these directories are library plumbing, not the model's code
# (transformers and other site-packages are model code and stay visible).
_LIBRARY_DIRS = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


@dataclass(frozen=True, slots=True)
class Guard:
    """One guard: its expression (export's symbols) and where the code added it."""

    expr: str
    location: str | None


@dataclass(slots=True)
class GuardLog:
    """Guards and symbol sources seen during one export."""

    guards: list[Guard]
    symbols: dict[str, str]  # export symbol (``s17``) -> source (``L['args'][0].size()[0]``)


class _Handler(logging.Handler):
    def __init__(self, log: GuardLog) -> None:
        super().__init__(logging.INFO)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a malformed torch log line must not break export
            return
        if match := _GUARD.match(message):
            self.log.guards.append(Guard(match.group(1), user_frame()))
        elif match := _SYMBOL.match(message):
            self.log.symbols[match.group(1)] = match.group(2)


@contextmanager
def capture_guards() -> Iterator[GuardLog]:
    """Record guards added inside the block; the logger is restored after."""
    log = GuardLog([], {})
    logger = logging.getLogger(_LOGGER)
    handler = _Handler(log)
    old = logger.handlers[:], logger.level, logger.propagate
    # Only our handler, not propagating: torch's own stderr handlers would
    # otherwise print every INFO line we turned on.
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield log
    finally:
        logger.handlers, _, logger.propagate = old
        logger.setLevel(old[1])


def user_frame(tb_frames: list[tuple[str, int, str]] | None = None) -> str | None:
    """``file:line in func: code`` of the innermost frame outside torch/stdlib.

    Args:
        tb_frames: ``(filename, lineno, name)`` triples, innermost last; the
            current stack when omitted.
    """
    if tb_frames is None:
        frames = []
        frame = sys._getframe(1)
        while frame is not None:
            frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back
        frames.reverse()
    else:
        frames = tb_frames
    for filename, lineno, name in reversed(frames):
        path = os.path.abspath(filename)
        in_stdlib = path.startswith(_STDLIB) and "-packages" not in path
        if filename.startswith("<") or in_stdlib or path.startswith(_LIBRARY_DIRS):
            continue
        code = linecache.getline(filename, lineno).strip()
        return f"{filename}:{lineno} in {name}: {code}"
    return None
