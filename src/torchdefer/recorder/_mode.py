"""RecordingMode: the dispatch mode active while ``deferred_init`` runs."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from torchdefer import _compat
from torchdefer.fake._mode import FakeSlotMode, no_fake_modes
from torchdefer.fake._storage_objects import storage_owner
from torchdefer.fake._tensor import FakeTensor, reported_device
from torchdefer.recorder._collectives import refuse_collective
from torchdefer.recorder._entries import ENTRIES, SLOW
from torchdefer.recorder._graph import Graph

__all__ = ["DISPATCH_FRAMES", "RecordingMode", "recording", "suspended"]

_FAKE = _compat.FAKE_MODE_KEY


class RecordingMode(FakeSlotMode):
    """Records every op, factory calls included, into ``graph``.

    It sits in PyTorch's FAKE mode slot (see :class:`FakeSlotMode`), which is
    what lets ``device="cuda"`` pass CUDA's lazy initialization on hosts
    without it.
    """

    def __init__(self, graph: Graph) -> None:
        super().__init__()
        self.graph = graph

    def __enter__(self) -> RecordingMode:
        out = super().__enter__()  # imports torch._dynamo first (FakeSlotMode)
        _compat.skip_dynamo_disable_when_not_compiling(RecordingMode)
        global DISPATCH_FRAMES
        DISPATCH_FRAMES = 1 + _compat.dispatch_wrapper_frames(RecordingMode)
        return out  # type: ignore[return-value]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE:
            return reported_device(args[0])
        kwargs = kwargs or {}
        # recorder._fast's one-step recorders (recorder/_entries.py) first: they take
        # no real tensor (a fill or detach of a deferred tensor of this graph, a
        # factory of plain sizes), so none of the calls below is theirs.
        fast = ENTRIES.fast_ops.get(id(func))
        if fast is not None:
            out = fast(self.graph, func, args, kwargs, DISPATCH_FRAMES)
            if out is not SLOW:
                return out
        if not _any_fake(types) and _real_meta_only(args, kwargs, self.graph):
            # Real meta tensors (``torch.tensor(0)`` under a meta device context,
            # as in accelerate's init_empty_weights(include_buffers=True)) have
            # no values to defer: run the op as eager code would.
            refuse_collective(func)
            with suspended():
                return func(*args, **kwargs)
        # recorder.record.record_general; refuses collectives
        return ENTRIES.record_general(self.graph, func, args, kwargs)


_DEVICE = torch.ops.prim.device.default
DISPATCH_FRAMES = 1
"""The Python frames, all library code, that sit at least between the recorder
and the dispatcher for a call from :class:`RecordingMode`: its own
``__torch_dispatch__`` and the wrappers of it (``_compat.dispatch_wrapper_frames``),
known once a recording was entered. Where the user's line is looked for, they
are jumped over unwalked (``sys._getframe``): each frame walked is made a
Python object, ~0.2 µs."""


def _any_fake(types: Any) -> bool:
    for t in types:  # a loop, not any(genexpr): this runs for every op
        if issubclass(t, FakeTensor):
            return True
    return False


def _real_meta_only(args: tuple, kwargs: dict | None, graph: Graph) -> bool:
    """Whether the call has tensor arguments, all of them real meta tensors, and no
    storage of a deferred tensor (``real_meta.set_(deferred.untyped_storage())``
    would make a real tensor alias recorded memory: eager's tensors share a
    storage there, the materialized ones would not).

    ATen arguments nest one level at most (a tensor list), so no pytree walk:
    this runs for every factory call.
    """
    seen = False
    arguments = (*args, *(kwargs or {}).values())
    for x in arguments:
        for t in x if isinstance(x, (list, tuple)) else (x,):
            if isinstance(t, torch.Tensor):
                if not t.is_meta:
                    return False
                seen = True
    if not seen:
        return False
    for x in arguments:
        if isinstance(x, (torch.UntypedStorage, torch.TypedStorage)) and (
            storage_owner(x) is not None or graph.holders.over(x) is not None
        ):
            return False
    return True


def recording(graph: Graph) -> contextlib.AbstractContextManager[Any]:
    """Record into ``graph`` unless a recording is already active."""
    if isinstance(_compat.get_dispatch_mode(_FAKE), RecordingMode):
        return contextlib.nullcontext()
    return RecordingMode(graph)


def suspended() -> contextlib.AbstractContextManager[None]:
    """Run real code while a recording is active (replay, constants, data reads).

    The recording mode sits in PyTorch's FAKE slot, which
    ``disable_current_modes`` leaves alone: :func:`no_fake_modes` takes it out
    and puts it back.
    """
    return no_fake_modes()
