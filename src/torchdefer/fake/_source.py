"""Where in the user's code an op was called: the innermost frame outside torch and torchdefer."""

from __future__ import annotations

import functools
import os
import sys

import torch

__all__ = ["is_library_file", "user_frame"]

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
    (not its site-packages) or generated code: never the user's line."""
    if filename.startswith(_STDLIB):
        return "-packages" not in filename
    return filename.startswith((*_LIBRARY_DIRS, *_GENERATED))


def user_frame(skip: int = 1) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of the innermost frame outside torch and torchdefer."""
    frame = sys._getframe(skip)
    while frame is not None:
        if not is_library_file(frame.f_code.co_filename):
            return (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None
