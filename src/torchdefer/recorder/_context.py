"""``with torchdefer.deferred():``: the context-manager form of ``deferred_init``.

Users wrap existing code this way (accelerate's ``init_empty_weights`` taught
them to)::

    with torchdefer.deferred():
        model = Model(cfg)

Inside the block every tensor created is fake and every op recorded, exactly
as inside ``deferred_init(Model, cfg)``, which is this block around one call.
Blocks nest: an inner ``deferred()`` or ``deferred_init`` records into the
outer block's graph, so tensors built at both levels can be combined, and
restores the default dtype and device it found when it ends (the dtype only
if the block's own thread changed it: it is process-wide, and another
thread's ``set_default_dtype`` is not the block's to undo).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from torchdefer import _compat
from torchdefer._compat import default_device_context, restore_default_device
from torchdefer._compat.patch import patched, setting
from torchdefer.errors import RecordingError
from torchdefer.recorder._composite import library_composites
from torchdefer.recorder._graph import Graph
from torchdefer.recorder._mode import RecordingMode
from torchdefer.recorder._rng_placement import RngRecorder
from torchdefer.recorder._subclasses import subclassing
from torchdefer.recorder._threads import dtype_log
from torchdefer.recorder._ties import watching_registrations

__all__ = ["deferred"]

_FAKE = _compat.FAKE_MODE_KEY
# Not torch.get_default_device(): it builds a tensor, which fails under
# `with torch.device("cuda")` on a host without CUDA.
_DEFAULT_DEVICE = setting(default_device_context, restore_default_device)
# Looked up at each call: while a recording runs, torch's is the logging wrapper.
_DEFAULT_DTYPE = setting(torch.get_default_dtype, lambda d: torch.set_default_dtype(d))


@contextlib.contextmanager
def deferred() -> Iterator[Graph]:
    """Record every tensor created in the block, as :func:`torchdefer.deferred_init` does.

    The default dtype and device, dispatch modes and the FAKE mode slot are
    left as found when the block ends, also when it raises. Ops on the tensors
    created inside are recorded after the block too (``model.half()``,
    weight tying), as with ``deferred_init``.

    Yields:
        The recorded :class:`~torchdefer.recorder.Graph` (the outer block's
        when nested). Most code ignores it.

    Raises:
        RecordingError: entered inside ``torchdefer.fake_mode()`` or PyTorch's
            ``FakeTensorMode``, which hold the same dispatch slot.

    >>> import torch, torchdefer
    >>> _ = torch.manual_seed(0); eager = torch.nn.Linear(4, 2)
    >>> _ = torch.manual_seed(0)
    >>> with torchdefer.deferred():
    ...     lazy = torch.nn.Linear(4, 2, device="cuda")  # no GPU needed
    >>> lazy.weight.device, torchdefer.is_deferred(lazy)
    (device(type='cuda', index=0), True)
    >>> real = torchdefer.materialize_module(lazy, device="cpu")
    >>> torch.equal(real.weight, eager.weight)
    True
    """
    active = _compat.get_dispatch_mode(_FAKE)
    if active is not None and not isinstance(active, RecordingMode):
        raise RecordingError(
            f"torchdefer.deferred() / deferred_init was entered inside {type(active).__name__}, "
            "which holds the same dispatch slot (torchdefer.fake_mode() or PyTorch's "
            "FakeTensorMode). Leave that mode first, or build everything inside one of them."
        )
    dtypes_set = dtype_log()
    mark = len(dtypes_set)

    def set_here(now: torch.dtype) -> bool:
        # The default dtype is process-wide: restored only if this thread set
        # it in the block and no other thread set it since.
        return len(dtypes_set) > mark and dtypes_set[-1] == now

    # The block may change defaults and fail before restoring them; a nested
    # block restores what it found too, as deferred_init promises.
    try:
        with patched(_DEFAULT_DEVICE), patched(_DEFAULT_DTYPE, restore_if=set_here):
            if isinstance(active, RecordingMode):  # nested: record into the outer graph
                yield active.graph
                return
            graph = Graph(RngRecorder())
            # subclassing(): nn.Parameter subclasses and lazy modules' tensors wrap
            # deferred data through torch.Tensor._make_subclass (recorder/_subclasses.py).
            with library_composites(), graph.rng.deferring(), RecordingMode(graph), \
                    subclassing(), watching_registrations():
                yield graph
    finally:
        del dtypes_set[mark:]
