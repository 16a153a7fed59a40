"""Where in the user's code an op was called: the innermost frame outside torch and torchdefer."""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from types import CodeType, FrameType

import torch

__all__ = ["SourceLocation", "is_library_code", "is_library_file", "user_frame"]


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """A line of the user's code: where an op was called.

    >>> SourceLocation("model.py", 12, "__init__")
    SourceLocation(file='model.py', line=12, function='__init__')
    >>> str(SourceLocation("model.py", 12, "__init__"))
    'model.py:12 in __init__'
    """

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"

_LIBRARY_DIRS = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # torchdefer itself
)
_STDLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep  # contextlib, functools, ...
# Code Python or torch generate (fx's graph modules); "<string>" and "<stdin>" are the user's.
_GENERATED = ("<frozen", "<eval_with_key")


@functools.cache  # one answer per file: called for each frame of each recorded op
def is_library_file(filename: str) -> bool:
    """Whether a frame's file is torch's, torchdefer's, the standard library's
    (not the site-packages some layouts keep inside it) or generated code:
    never the user's line."""
    if filename.startswith((*_LIBRARY_DIRS, *_GENERATED)):
        return True
    return filename.startswith(_STDLIB) and "-packages" not in filename


def is_library_code(code: CodeType) -> bool:
    """:func:`is_library_file`, and methods ``dataclasses`` generates (``__eq__``
    of a dataclass holding tensors is compiled from a string, like user code)."""
    return is_library_file(code.co_filename) or getattr(code, "co_qualname", "").startswith(
        "__create_fn__.")


# id(code) -> (code, is_library_code(code), {f_lasti: user_frame's answer}).
# user_frame runs for every recorded op and walks ~10 frames; the code object
# is kept so that its id stays its own. A user frame's line is kept per
# instruction offset: ``f_lineno`` walks the code's line table from its start
# (~2 µs in a 300-line function), and the nodes of one line share one location.
_known_codes: dict[int, tuple[CodeType, bool, dict[int, SourceLocation]]] = {}
_CODES_KEPT = 1 << 16  # code made at run time (exec, dataclasses) could grow it
_LINES_KEPT = 1 << 12  # instruction offsets kept per code object


def user_frame(skip: int = 1) -> SourceLocation | None:
    """The location of the innermost frame outside torch and torchdefer, from the
    frame ``skip`` frames above the caller's on.

    The frames below ``skip`` are jumped over by ``sys._getframe``; each frame
    walked with ``f_back`` is made a Python object (~0.2 µs), which is most of
    this function's cost: callers skip what they know to be library code (the
    recording mode's dispatch wrappers, ``recorder._mode.DISPATCH_FRAMES``).
    """
    frame: FrameType | None = sys._getframe(skip)
    known = _known_codes
    while frame is not None:
        code = frame.f_code
        entry = known.get(id(code))
        if entry is None or entry[0] is not code:
            if len(known) >= _CODES_KEPT:
                known.clear()
            entry = known[id(code)] = (code, is_library_code(code), {})
        if not entry[1]:
            return _where(frame, code, entry[2])
        frame = frame.f_back
    return None


def _where(frame: FrameType, code: CodeType, lines: dict[int, SourceLocation]
           ) -> SourceLocation:
    """The location of ``frame``, by its instruction offset once seen."""
    if sys.gettrace() is not None:  # a tracer may set f_lineno itself: ask the frame
        return SourceLocation(code.co_filename, frame.f_lineno, code.co_name)
    lasti = frame.f_lasti
    where = lines.get(lasti)
    if where is None:
        if len(lines) >= _LINES_KEPT:
            lines.clear()
        where = lines[lasti] = SourceLocation(code.co_filename, frame.f_lineno, code.co_name)
    return where
