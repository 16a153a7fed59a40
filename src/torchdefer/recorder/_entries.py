"""The recorder's answers to calls on deferred tensors: the recorder's one inversion.

``recorder._record`` and its helpers build deferred tensors, so they import
``recorder._tensor``; yet every op on a deferred tensor (and on the recording
mode) is answered by them. Rather than import upward, :class:`DeferredTensor
<torchdefer.recorder._tensor.DeferredTensor>` and
:class:`~torchdefer.recorder._mode.RecordingMode` call through :data:`ENTRIES`,
which ``recorder/__init__.py`` fills once (:func:`bind`) when the package is
imported (importing any ``torchdefer`` module imports it first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdefer.errors import InternalError

__all__ = ["ENTRIES", "SLOW", "Entries", "bind"]

SLOW = object()
"""What a one-step recorder of ``Entries.fast_ops`` returns when the call is not of
its plain form (nothing recorded): the general path answers it."""


def _unbound(*args: Any, **kwargs: Any) -> Any:
    raise InternalError("the recorder's entries are not bound (recorder/__init__.py binds "
                        "them); this is a bug in torchdefer, please report it")


class Entries:
    """Where a deferred tensor's calls go; each field is named for its function."""

    __slots__ = ("data_read", "deepcopy_deferred", "detach_for_parameter", "fast_ops",
                 "library_call_asking_is_meta", "make_parameter", "record_call",
                 "record_data_set", "record_general", "shallow_copy_deferred")

    def __init__(self) -> None:
        self.record_call: Callable[..., Any] = _unbound  # recorder.record: every op
        # recorder._fast.FAST_OPS, id(op) -> its one-step recorder (or SLOW), and
        # recorder.record's path for the rest: the recording mode asks them itself,
        # one frame fewer for the ops of nearly every model (~2700 of the 70B Llama).
        self.fast_ops: dict[int, Callable[..., Any]] = {}
        self.record_general: Callable[..., Any] = _unbound
        self.data_read: Callable[..., Any] = _unbound  # recorder.record: .item(), .tolist()
        self.record_data_set: Callable[..., Any] = _unbound  # recorder.record: t.data = x
        # recorder.composite: torch's trunc_normal_ after deferred_init returned
        self.library_call_asking_is_meta: Callable[..., Any] = _unbound
        self.detach_for_parameter: Callable[..., Any] = _unbound  # recorder.subclasses
        self.make_parameter: Callable[..., Any] = _unbound  # recorder.subclasses
        self.deepcopy_deferred: Callable[..., Any] = _unbound  # recorder._copy
        self.shallow_copy_deferred: Callable[..., Any] = _unbound  # recorder._copy


ENTRIES = Entries()


def bind(**entries: Any) -> None:
    """Fill :data:`ENTRIES` (every field, once, from ``recorder/__init__.py``)."""
    missing = set(Entries.__slots__) - set(entries)
    if missing:
        raise InternalError(f"recorder entries left unbound: {sorted(missing)}")
    for name, fn in entries.items():
        setattr(ENTRIES, name, fn)
