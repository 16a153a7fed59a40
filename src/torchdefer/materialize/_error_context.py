"""How replay adds context to an error: which op, which tensor, which source line.

The error classes are in :mod:`torchdefer.errors` (one hierarchy);
:func:`with_context` is replay's own mechanism.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdefer.errors import ReplayError

__all__ = ["with_context"]


# One combined class per original exception class, so that the same failure
# twice gives the same type (and `except` clauses, pickling, repr are stable).
_combined: dict[type[BaseException], type[ReplayError]] = {}


def with_context(error: Exception, message: str) -> Exception:
    """An exception carrying ``message`` that is both a ReplayError and of ``type(error)``.

    The original's attributes are copied; chain it with ``raise ... from error``.
    Falls back to a plain :class:`ReplayError` for a class that cannot be
    combined (an instance layout that clashes with ``RuntimeError``'s).
    """
    kind = _original_kind(type(error))
    combined = _combined_type(kind)
    if combined is None:
        return ReplayError(message)
    out = combined(message)
    for key, value in getattr(error, "__dict__", {}).items():
        out.__dict__.setdefault(key, value)
    return out


def _original_kind(kind: type[BaseException]) -> type[BaseException]:
    for original, combined in _combined.items():
        if combined is kind:
            return original
    return kind


def _combined_type(kind: type[BaseException]) -> type[ReplayError] | None:
    if issubclass(kind, ReplayError):  # ours, or combined already
        return kind
    if issubclass(ReplayError, kind):  # RuntimeError, Exception: a ReplayError already is one
        return ReplayError
    combined = _combined.get(kind)
    if combined is None:
        try:
            combined = type(
                f"ReplayError[{kind.__qualname__}]",
                (ReplayError, kind),
                {"__init__": _init, "__str__": _str, "__reduce__": _reduce, "__module__": __name__},
            )
        except TypeError:
            return None
        _combined[kind] = combined
    return combined


def _init(self: BaseException, message: str) -> None:
    # The original class's __init__ may want other arguments; the message is all.
    BaseException.__init__(self, message)


def _str(self: BaseException) -> str:
    # KeyError and friends would print the repr of the message.
    return str(self.args[0]) if self.args else ""


def _reduce(self: BaseException) -> tuple[Callable[..., Exception], tuple[Any, ...], Any]:
    return (_rebuild, (_original_kind(type(self)), str(self)), self.__dict__ or None)


def _rebuild(original: type[BaseException], message: str) -> Exception:
    """Unpickle a combined error (its class is made at run time, so not importable)."""
    combined = _combined_type(original)
    return (combined or ReplayError)(message)
