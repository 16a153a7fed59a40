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

__all__ = ["TorchdeferError"]


class TorchdeferError(Exception):
    """Base class of torchdefer's errors; the message says what, where and what to do.

    >>> import torch, torchdefer
    >>> try:
    ...     torchdefer.deferred_init(torch.empty, 2, layout=torch.sparse_coo)
    ... except torchdefer.TorchdeferError as e:
    ...     print(type(e).__name__, isinstance(e, RuntimeError))
    RecordingError True
    """
