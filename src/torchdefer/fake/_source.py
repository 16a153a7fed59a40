"""Where in the user's code an op was called: the innermost frame outside torch and torchdefer."""

from __future__ import annotations

import os
import sys

import torch

__all__ = ["user_frame"]

_LIBRARY_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(__file__)) + os.sep,  # torchdefer itself
    os.path.dirname(os.__file__) + os.sep,  # the standard library (contextlib, ...)
)


def user_frame(skip: int = 1) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of the innermost frame outside torch and torchdefer."""
    frame = sys._getframe(skip)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_LIBRARY_DIRS) and not filename.startswith("<frozen"):
            return (filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None
