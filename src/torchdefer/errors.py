"""The one base class of every error torchdefer raises.

``except torchdefer.TorchdeferError`` catches them all. Each error also keeps
the built-in type it always had (``RecordingError`` and ``ReplayError`` are
``RuntimeError``\\ s, ``DescriptorMismatch`` is a ``TypeError``), so existing
``except RuntimeError`` blocks still work. A failure replay adds context to
(an out-of-memory error, a ``ValueError`` from an op) keeps its own type as
well: see :func:`torchdefer.materialize.errors.with_context`.

This module imports nothing from torchdefer, so every layer (``fake`` first)
can derive from it.
"""

from __future__ import annotations

__all__ = [
    "InternalError",
    "LookupAttributeError",
    "LookupKeyError",
    "StateError",
    "TorchdeferError",
    "UsageError",
    "UsageTypeError",
]


class TorchdeferError(Exception):
    """Base class of torchdefer's errors; the message says what, where and what to do.

    >>> import torch, torchdefer
    >>> try:
    ...     torchdefer.deferred_init(torch.empty, 2, layout=torch.sparse_coo)
    ... except torchdefer.TorchdeferError as e:
    ...     print(type(e).__name__, isinstance(e, RuntimeError))
    RecordingError True
    """


class UsageError(TorchdeferError, ValueError):
    """An argument's value torchdefer cannot honour (a range, a name, a mode).

    >>> import torchdefer
    >>> from torchdefer.descriptors import MetaTensorType
    >>> try:
    ...     MetaTensorType([-1])
    ... except torchdefer.errors.UsageError as e:
    ...     print(isinstance(e, ValueError), str(e).split(";")[0])
    True MetaTensorType: shape[0] is -1
    """


class UsageTypeError(TorchdeferError, TypeError):
    """An argument of a kind the call does not take (a function where a module
    belongs, a tensor where a descriptor belongs, ...)."""


class LookupKeyError(TorchdeferError, KeyError):
    """A name or key that is not there; the message lists those that are."""

    def __str__(self) -> str:  # KeyError's str() would quote the whole message
        return str(self.args[0]) if self.args else ""


class LookupAttributeError(TorchdeferError, AttributeError):
    """An attribute that is not there; the message lists those that are."""


class StateError(TorchdeferError, RuntimeError):
    """The call is well formed but the object is not in a state that allows it
    (a program built in train mode called in eval mode, weights not bound)."""


class InternalError(TorchdeferError, RuntimeError):
    """torchdefer broke one of its own invariants: a bug in torchdefer, never in
    your code. The message says what was expected; please report it."""
