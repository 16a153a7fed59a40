"""The inversions: every call a lower package makes into a higher one, in one registry.

Imports point one way (``docs/ARCHITECTURE.md``): ``rng`` knows nothing of
the recorder, the core never imports ``checkpoint`` or ``distributed``. Yet
a lower package sometimes needs work only a higher one can do. Each such
call is a :class:`Hook` here, installed by the package that can answer it
(hook: who calls it; who installs it):

* ``VALUE_READER``: the recorder, for ``.item()`` / ``.tolist()`` while
  building; ``materialize._api``, on import.
* ``CALL_RUNNER``: ``rng._states``, for an anchor after a call the draw model
  cannot count; ``materialize._replay``, on import.
* ``SHARDED_MATERIALIZER``: ``materialize._api``; ``torchdefer/__init__.py``
  (``distributed.materialize_module``, imported on first use).
* ``DISTRIBUTED_LOADER``: ``checkpoint._load``; ``torchdefer/__init__.py``
  (``distributed._load``).
* ``SHARDED_WRITER``: ``checkpoint._write``; ``torchdefer/__init__.py``
  (``distributed._save``).

``import torchdefer`` installs them all; a caller that finds its hook empty
(only a subpackage was imported) raises the hook's error, which says so.
A new inversion is a new row here, not a new module-level list with its
own setter. The signatures name only torch and builtin types: the lower
package cannot name the higher one's.

>>> from torchdefer._hooks import VALUE_READER
>>> import torchdefer  # materialize installs the reader
>>> VALUE_READER.installed
True
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from torchdefer.errors import CheckpointUsageError, StateError, TorchdeferError

__all__ = [
    "CALL_RUNNER",
    "DISTRIBUTED_LOADER",
    "SHARDED_MATERIALIZER",
    "SHARDED_WRITER",
    "VALUE_READER",
    "Hook",
]

F = TypeVar("F", bound=Callable[..., Any])


class Hook(Generic[F]):
    """One call a lower package makes into a higher one; the higher one installs it."""

    __slots__ = ("_error", "_fn", "_missing", "name")

    def __init__(self, name: str, missing: str, error: type[TorchdeferError] = StateError) -> None:
        self.name = name
        self._missing = missing  # what the error says when nothing is installed
        self._error = error
        self._fn: F | None = None

    def install(self, fn: F) -> None:
        """Make ``fn`` the answer (replacing any installed before)."""
        self._fn = fn

    @property
    def installed(self) -> bool:
        return self._fn is not None

    def get(self) -> F:
        """The installed function; the hook's error if none is."""
        if self._fn is None:
            raise self._error(self._missing)
        return self._fn

    @contextlib.contextmanager
    def replaced(self, fn: F | None) -> Iterator[None]:
        """``fn`` (None: nothing) installed for the block, the previous one after it."""
        previous, self._fn = self._fn, fn
        try:
            yield
        finally:
            self._fn = previous

    def __repr__(self) -> str:
        return f"Hook({self.name}, {'installed' if self.installed else 'empty'})"


# Any: a DeferredTensor, which this module (below the recorder) cannot name.
VALUE_READER: Hook[Callable[[Any], torch.Tensor]] = Hook(
    "VALUE_READER",
    "Reading a deferred tensor's value needs torchdefer.materialize; "
    "import torchdefer (not only torchdefer.recorder).",
)
"""``reader(deferred)``: the real value of a deferred tensor while recording, nothing marked."""

CALL_RUNNER: Hook[Callable[[Any, torch.Tensor, Any], torch.Tensor]] = Hook(
    "CALL_RUNNER",
    "Placing a random op after one whose draws cannot be counted needs "
    "torchdefer.materialize; import torchdefer (not only torchdefer.recorder).",
)
"""``runner(call, state, model)``: the generator state after running a random call the
draw model cannot count, from ``state``."""

SHARDED_MATERIALIZER: Hook[Callable[[nn.Module], nn.Module]] = Hook(
    "SHARDED_MATERIALIZER",
    "Materializing a module whose parameters are sharded needs torchdefer.distributed; "
    "use torchdefer.distributed.materialize_module(module), or import torchdefer.",
)
"""``materializer(module)``: each rank's shards of a sharded module made real, in place."""

DISTRIBUTED_LOADER: Hook[Callable[..., Any]] = Hook(
    "DISTRIBUTED_LOADER",
    "Loading into a sharded module needs torchdefer.distributed; import "
    "torchdefer (not only its subpackages).",
    CheckpointUsageError,
)
"""``loader(module, source, **options)``: ``torchdefer.load_state_dict`` for a sharded module."""

SHARDED_WRITER: Hook[Callable[..., Path]] = Hook(
    "SHARDED_WRITER",
    "torchdefer.distributed is needed to save a sharded model; import torchdefer "
    "(not only its subpackages).",
    CheckpointUsageError,
)
"""``writer(model, path, **options)``: each rank writes its shards (DCP)."""
