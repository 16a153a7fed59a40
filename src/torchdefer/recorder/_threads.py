"""What other threads see while one thread records.

Two pieces of state a recording touches are process-wide, not per thread:
the default CPU generator and the default dtype. Eager code shares them with
every thread too, so a program whose threads are sequenced (one waits for
another) is deterministic, and must stay so when one of them records:

* every read of a generator's state by a recording thread
  (``Generator.get_state`` and its neighbours, so ``torch.get_rng_state()``
  and ``fork_rng`` too: ``_compat.generator``), ``threading.Thread.start``
  and ``os.fork`` (so ``multiprocessing``'s fork) first put the exact state
  in the generators, where a lazy marker may stand (``rng._ledger``); other
  threads never see a marker, since markers are only used while the
  recording thread is alone.
* ``torch.set_default_dtype`` and ``torch.set_default_tensor_type`` called by
  a recording thread are logged per thread, so a block restores the default
  dtype only if its own thread changed it, and not a change another thread
  made meanwhile.

Two more patches ride on the install, though they are not about threads:
``Tensor.set_``, whose binding takes no ``__torch_function__``, refuses a
source view whose autograd history cannot be rebuilt on fake tensors with
torchdefer's error rather than PyTorch's internal assert
(``fake._calls.set_refusing_lost_view_history``); and ``Tensor.data``'s
setter sees ``real.data = deferred``, which its binding hands to ``self``'s
``__torch_function__`` alone.

The patches are installed once while any thread records (the first block in
installs them, the last one out removes them; ``set_``'s stays, since the
deferred tensors outlive the recording) and route each call to the
calling thread's recording: patching per block would let two threads'
blocks, ending in another order than they began, leave a patch behind.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.random

from torchdefer import _compat
from torchdefer._compat import generator as _generator
from torchdefer._compat.patch import PatchStack, SharedPatches, attribute, patched
from torchdefer.fake._calls import set_refusing_lost_view_history
from torchdefer.fake._tensor import FakeTensor
from torchdefer.recorder._record import record_data_set

__all__ = ["dtype_log", "reads_seen", "recording_thread"]

_lock = threading.Lock()
_syncs: dict[int, Any] = {}  # thread id -> its outermost recording's sync(generator=None)
_reads: list[bool] = []  # [whether every generator read is seen] while the patches are in
_forks: list[bool] = []  # whether the fork hook is registered


class _Log(threading.local):
    def __init__(self) -> None:
        self.dtypes: list[torch.dtype] = []  # set by this thread while recording


_log = _Log()


def dtype_log() -> list[torch.dtype]:
    """The default dtypes this thread set while recording, oldest first."""
    return _log.dtypes


def reads_seen() -> bool:
    """Whether every read of a generator's state is seen now (a marker may stand in it)."""
    return bool(_reads and _reads[0])


@contextlib.contextmanager
def recording_thread(sync: Any) -> Iterator[None]:
    """While inside, this thread records; ``sync(generator=None)`` puts exact states in
    the generators (that one's, or all)."""
    thread = threading.get_ident()
    with _lock:
        _syncs[thread] = sync
    try:
        with _PATCHES.held():
            yield
    finally:
        with _lock:
            del _syncs[thread]


def _sync_mine(generator: torch.Generator | None = None) -> None:
    sync = _syncs.get(threading.get_ident())
    if sync is not None:
        sync(generator)


def _fork_hook() -> None:
    """Register, once per process, a sync before ``os.fork`` (a child must not inherit a
    marker: it would draw numbers no eager program draws). Hooks cannot be removed;
    outside a recording it does nothing."""
    if not _forks and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_sync_mine)
        _forks.append(True)


def _set_once() -> None:
    """Wrap ``Tensor.set_`` at the first recording, for good: the deferred tensors a
    recording returns outlive it, and a set_ of one of their views after it
    ended reached PyTorch's internal assert. The wrapper only reads an error."""
    if not _set_wrapped:
        torch.Tensor.set_ = set_refusing_lost_view_history(torch.Tensor.set_)  # type: ignore[method-assign]
        _set_wrapped.append(True)


_set_wrapped: list[bool] = []

_C_DATA = _compat.TensorBase.__dict__["data"]
_data_get = _compat.descriptor_get(_compat.TensorBase, "data")
_data_set = _compat.descriptor_set(_compat.TensorBase, "data")


class _DataOfReal:
    """``Tensor.data`` seeing ``real.data = deferred``: the C setter calls
    ``__torch_function__`` of ``self`` alone, so a real target (a meta tensor
    made by ``torch.tensor`` under a meta device) reached ``set_data`` with a
    deferred tensor and failed there with "incompatible tensor type".

    Read on the class it is torch's own C property, so ``torch.Tensor.data.__get__``
    (what ``__torch_function__`` handlers compare with) is unchanged.
    """

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return _C_DATA if obj is None else _data_get(obj)

    def __set__(self, obj: torch.Tensor, new: torch.Tensor) -> None:
        if isinstance(new, FakeTensor) and not isinstance(obj, FakeTensor):
            record_data_set(obj, new)
            return
        _data_set(obj, new)


_DATA_OF_REAL = _DataOfReal()


_SET_TYPE = attribute(torch, "set_default_tensor_type")
_SET_DTYPE = attribute(torch, "set_default_dtype")
_START = attribute(threading.Thread, "start")
_DATA = attribute(torch.Tensor, "data")


def _install(stack: PatchStack) -> None:
    """Put the patches in; ``stack`` takes them out again, in reverse order."""
    _fork_hook()
    start = threading.Thread.start
    set_dtype = torch.set_default_dtype
    set_type = torch.set_default_tensor_type

    def exact_start(self: threading.Thread) -> None:
        _sync_mine()
        start(self)

    def logged_set_default_dtype(d: torch.dtype) -> None:
        set_dtype(d)
        _note_dtype()

    def logged_set_default_tensor_type(t: Any) -> None:
        set_type(t)
        _note_dtype()

    for new, old in ((exact_start, start),
                     (logged_set_default_dtype, set_dtype),
                     (logged_set_default_tensor_type, set_type)):
        new.__doc__, new.__name__ = old.__doc__, old.__name__
    stack.enter(patched(_SET_TYPE, logged_set_default_tensor_type))
    stack.enter(patched(_SET_DTYPE, logged_set_default_dtype))
    stack.enter(patched(_START, exact_start))
    stack.enter(patched(_DATA, _DATA_OF_REAL))  # a descriptor in place of TensorBase's C one
    _set_once()
    # The generator reads go first (last in); reads_seen() is False before they do.
    reads = _generator.intercept_reads(_sync_mine)
    if reads:
        stack.callback(_generator.restore_reads)
    _reads[:] = [reads]
    stack.callback(_reads.clear)


# In while any thread records (the first block in installs them, the last one
# out removes them).
_PATCHES = SharedPatches(_install)


def _note_dtype() -> None:
    if threading.get_ident() in _syncs:
        _log.dtypes.append(torch.get_default_dtype())

