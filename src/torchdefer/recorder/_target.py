"""The door on a deferred tensor: what it stands for, and marking it materialized.

A :class:`~torchdefer.recorder._tensor.DeferredTensor` holds a recorded value
that moves as the tensor changes (``t_()``, ``.data = x`` rebind it; an
in-place op bumps its storage's version). The packages built on the recorder
(materialize, checkpoint, distributed, viz) ask it what it stands for *now*
through :func:`target_of`, and tell the recorder that its storage became
real through :func:`mark_materialized`, never through its private fields:
the recorder may change how it keeps them.

>>> import torch, torchdefer
>>> from torchdefer.recorder import target_of
>>> m = torchdefer.deferred_init(torch.nn.Linear, 4, 2)
>>> t = target_of(m.weight)
>>> t.version, t.meta.size  # empty, then kaiming_uniform_ wrote it once
(1, (2, 4))

This module deliberately does not replay anything: what a target's real
tensor is belongs to ``torchdefer.materialize``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from torchdefer.errors import UsageTypeError
from torchdefer.recorder._graph import Graph, Storage, TensorMeta, Value
from torchdefer.recorder._tensor import DeferredTensor

__all__ = ["Target", "mark_materialized", "target_of"]


@dataclass(frozen=True, slots=True, eq=False)
class Target:
    """A recorded value at one version of its storage: what replay must produce.

    Frozen: taken at one moment, it keeps naming that version even when the
    tensor is written again later (a replay started before sees what it asked
    for). Compared by identity (a graph is not compared field by field);
    compare ``.key`` to ask whether two name the same value and version.
    """

    graph: Graph
    value: Value
    version: int
    # The recorded storage the value lives in (shared by its views), and the
    # value's recorded metadata (size, stride, dtype, reported device): plain
    # fields, read per tensor by materialize without a call into the recorder.
    storage: Storage
    meta: TensorMeta

    @property
    def key(self) -> tuple[Value, int]:
        """``(value, version)``: how the slice and replay name a wanted value."""
        return self.value, self.version

    @property
    def materialized(self) -> bool:
        """Whether its storage was made real (later recorded writes are refused)."""
        return self.value.storage.materialized


def target_of(tensor: torch.Tensor) -> Target:
    """What the deferred ``tensor`` stands for now: its value at its storage's latest version.

    Raises:
        UsageTypeError: ``tensor`` is not deferred (a real tensor, or a wrapper
            such as a DTensor: pass its local tensor).
    """
    if not isinstance(tensor, DeferredTensor):
        raise UsageTypeError(
            f"target_of expects a deferred tensor (from torchdefer.deferred_init), got "
            f"{type(tensor).__name__}; a real tensor has no recording, and a DTensor or "
            "FSDP2 parameter wraps one: pass its local tensor."
        )
    value = tensor._value
    storage = value.storage
    return Target(tensor._graph, value, storage.version, storage, value.meta)


def mark_materialized(*targets: torch.Tensor | Target) -> Callable[[], None]:
    """Record that these deferred tensors' storages are real now: from then on a
    recorded write to them is refused (the real tensor would not see it).

    Call it once the real tensor took the deferred one's place, not for a
    replay that may still be thrown away.

    Returns:
        What undoes it (a staged install rolled back): it unmarks the storages
        this call marked, and leaves those that were marked before.
    """
    storages = {id(s): s for s in map(_storage, targets)}
    changed = [s for s in storages.values() if not s.materialized]
    for storage in changed:
        storage.materialized = True

    def undo() -> None:
        for storage in changed:
            storage.materialized = False

    return undo


def _storage(t: torch.Tensor | Target) -> Storage:
    return t.storage if isinstance(t, Target) else target_of(t).storage
