"""The last step of a load: every change to the module, checked first, then made all together.

A load changes a module in four ways: deferred tensors the checkpoint fills
become the loaded tensors, deferred tensors it lacks become their replay
(both swaps), tensors already real are copied into, and a caller may add
changes of its own (a sharded module's shards: :meth:`Installation.stage_step`).
:class:`Installation` collects them (``stage_*``), checking each on the way,
and :meth:`Installation.commit` makes them in an order that lets a failure
leave every tensor as it was (same object, same storage, same values):

1. *before the commit*, everything that can refuse or run out of memory:
   reading and converting (into fresh tensors of the target's dtype and
   device, :func:`~torchdefer.checkpoint._assign.prepare`), replaying missing
   tensors, asking PyTorch whether each swap will be made, checking each copy
   (shape, dtype, device, inference tensors, meta tensors, expanded tensors)
   and cloning a source that overlaps another copy's target;
2. *undoable*: the swaps, the caller's steps, grads, and copies into tensors
   whose ``copy_`` runs code of their own (a tensor subclass with
   ``__torch_function__``/``__torch_dispatch__``, or a device other than CPU
   and CUDA), each after a backup of its target. A failure undoes all of them;
   ``agree`` (the distributed loader's vote) lets every rank undo together;
3. *last*, copies into plain CPU/CUDA tensors. These run no Python and
   allocate nothing (same shape, dtype and device, no overlap, all checked),
   so they are made without a backup: backing up every real tensor would
   double the memory of a load into a materialized model.

A ``KeyboardInterrupt`` (SIGINT) arriving during the commit is raised when
it ends, so the commit is made whole or undone whole, never cut in step 3.
A copy of step 3 that fails anyway (the device failing) raises a
:class:`~torchdefer.checkpoint.CheckpointError` naming which tensors hold
loaded values: never a silently half-loaded model.
"""

from __future__ import annotations

import contextlib
import inspect
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from torchdefer import _compat
from torchdefer.errors import CheckpointError, CheckpointUsageError
from torchdefer.materialize._api import mark_replayed
from torchdefer.materialize._cache import keep_loaded
from torchdefer.materialize._swap import check_swap, exchange, shell_for, undo
from torchdefer.recorder._target import Target, target_of
from torchdefer.recorder._tensor import DeferredTensor

__all__ = ["Installation"]


@dataclass(slots=True)
class _Swap:
    target: DeferredTensor  # the module's deferred tensor object
    shell: torch.Tensor  # the real tensor object it exchanges everything with
    path: str
    real: torch.Tensor  # what the target becomes (for the cache and the flag)
    recorded: Target  # what the target stood for when staged
    loaded: bool  # from the checkpoint (kept for views of it) or replayed


@dataclass(slots=True)
class _Copy:
    target: torch.Tensor  # the module's real tensor, copied into in place
    source: torch.Tensor  # checked: same shape, dtype and device, no overlap
    path: str


Step = tuple[Callable[[], None], Callable[[], None]]  # (make the change, undo it)


class Installation:
    """The changes of one load, all checked before :meth:`commit` makes the first.

    >>> import torch, torchdefer
    >>> from torchdefer.checkpoint._install import Installation
    >>> m = torchdefer.deferred_init(torch.nn.Linear, 2, 2)
    >>> changes = Installation()
    >>> changes.stage_loaded(m.weight, torch.ones(2, 2), "weight")
    >>> torchdefer.is_deferred(m.weight)   # staged, not made
    True
    >>> changes.commit(); torch.equal(m.weight, torch.ones(2, 2))
    True
    """

    def __init__(self) -> None:
        self._swaps: list[_Swap] = []
        self._steps: list[Step] = []
        self._grads: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._guarded: list[_Copy] = []  # copy_ may run code: backed up (step 2)
        self._plain: list[_Copy] = []  # cannot fail once checked: last (step 3)

    def stage_loaded(self, target: torch.Tensor, real: torch.Tensor, path: str) -> None:
        """``target`` (deferred: becomes ``real``; real: ``real`` is copied into it)."""
        if isinstance(target, DeferredTensor):
            self._stage_swap(target, real, path, loaded=True)
        else:
            _check_copy(target, real, path)
            (self._plain if _plain_copy(target) else self._guarded).append(
                _Copy(target, real, path))

    def stage_replayed(self, target: DeferredTensor, real: torch.Tensor, path: str) -> None:
        """A tensor the checkpoint lacks, replayed from the recording."""
        self._stage_swap(target, real, path, loaded=False)

    def stage_grads(self, grads: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """``(parameter, grad)`` pairs to put back once swapped (a grad lives on the impl)."""
        self._grads.extend(grads)

    def stage_step(self, make: Callable[[], None], undo_it: Callable[[], None]) -> None:
        """A change of the caller's, made after the swaps; ``undo_it`` reverts it exactly."""
        self._steps.append((make, undo_it))

    def commit(self, then: Callable[[], None] | None = None,
               agree: Callable[[BaseException | None], None] | None = None) -> None:
        """Make every staged change; a failure undoes those made, and raises.

        Args:
            then: runs after the swaps and steps, before the copies (the missing
                views of loaded tensors, which need those in place); if it
                raises, everything is undone too.
            agree: called once, with ``None`` if this process made every undoable
                change, else its error; it raises when another process failed
                (the distributed loader's vote), and then everything is undone.
        """
        undos: list[Callable[[], None]] = []
        with _interrupts_held():
            try:
                self._isolate_sources()  # allocates: inside, so that a failure is voted
                self._make_undoable(undos, then)
            except BaseException as error:
                _undo_all(undos)
                if agree is not None:
                    with contextlib.suppress(CheckpointError):  # this process's error wins
                        agree(error)
                raise
            if agree is not None:
                try:
                    agree(None)
                except BaseException:
                    _undo_all(undos)
                    raise
            for swap in self._swaps:
                mark_replayed(swap.recorded, swap.real)
            self._copy_plain()
        self._swaps, self._steps, self._grads, self._guarded, self._plain = [], [], [], [], []

    def _make_undoable(self, undos: list[Callable[[], None]],
                       then: Callable[[], None] | None) -> None:
        for swap in self._swaps:
            exchange(swap.target, swap.shell, swap.path)
            undos.append(_undo_swap(swap))
        for swap in self._swaps:
            if swap.loaded:
                # target is the loaded tensor now: views of it are rebuilt over it
                undos.append(keep_loaded(swap.recorded.value, swap.target))
        for make, undo_it in self._steps:
            make()
            undos.append(undo_it)
        with torch.no_grad():
            for parameter, grad in self._grads:
                old = parameter.grad
                parameter.grad = grad
                undos.append(_grad_restorer(parameter, old))
        if then is not None:
            then()
        for copy in self._guarded:
            backup = copy.target.detach().clone()
            undos.append(_copy_restorer(copy.target, backup))
            _copy(copy.target, copy.source)

    def _copy_plain(self) -> None:
        done: list[str] = []
        try:
            for copy in self._plain:
                _copy(copy.target, copy.source)
                done.append(copy.path)
        except BaseException as e:
            left = [c.path for c in self._plain[len(done):]]
            raise CheckpointError(
                f"Copying the checkpoint into '{left[0]}' failed ({type(e).__name__}: {e}) "
                "after every check passed: the device failed. The module is partly "
                f"loaded: {len(done)} real tensors hold loaded values "
                f"({_few(done)}), {len(left)} their old ones ({_few(left)}); every "
                "deferred tensor was loaded. Load again once the device works."
            ) from e

    def _isolate_sources(self) -> None:
        """Clone a source that overlaps a copy's target (a state dict holding the
        module's own real tensors under other names, for a copy or a swap): each
        tensor then gets the value the state dict held at the call, whatever was
        copied before, and a storage of its own.
        A source that *is* its target is left out: the copy would change nothing."""
        copies = [*self._guarded, *self._plain]
        if not copies:
            return
        by_storage: dict[tuple[torch.device, int], list[tuple[int, int]]] = {}
        for copy in copies:
            span = _span(copy.target)
            if span is not None:
                by_storage.setdefault(span[0], []).append(span[1])
        for swap in self._swaps:
            # A deferred tensor loaded from a real one's memory would see its copy.
            span = _span(swap.real) if swap.loaded else None
            if span is not None and any(_overlap(span[1], o) for o in by_storage.get(span[0], ())):
                swap.real = swap.real.clone()
                swap.shell = shell_for(swap.target, swap.real, swap.path)
                check_swap(swap.target, swap.shell, swap.path)
        for kind in (self._guarded, self._plain):
            for copy in list(kind):
                span = _span(copy.source)
                if span is None:
                    continue
                if _same_memory(copy.source, copy.target):
                    if len(by_storage.get(span[0], ())) == 1:
                        kind.remove(copy)  # only it uses that memory: nothing to copy
                        continue
                if any(_overlap(span[1], other) for other in by_storage.get(span[0], ())):
                    copy.source = copy.source.clone()

    def _stage_swap(self, target: DeferredTensor, real: torch.Tensor, path: str,
                    loaded: bool) -> None:
        shell = shell_for(target, real, path)
        check_swap(target, shell, path)
        self._swaps.append(_Swap(target, shell, path, real, target_of(target), loaded))


def _undo_swap(swap: _Swap) -> Callable[[], None]:
    return lambda: undo(swap.target, swap.shell, swap.path)


def _grad_restorer(parameter: torch.Tensor, old: torch.Tensor | None) -> Callable[[], None]:
    def restore() -> None:
        parameter.grad = old
    return restore


def _copy_restorer(target: torch.Tensor, backup: torch.Tensor) -> Callable[[], None]:
    return lambda: _copy(target, backup)


def _undo_all(undos: list[Callable[[], None]]) -> None:
    for undo_it in reversed(undos):
        undo_it()


def _copy(target: torch.Tensor, source: torch.Tensor) -> None:
    with torch.no_grad():
        target.copy_(source)


# The Tensor methods whose own override would make ``copy_`` run code of the class's.
_HOOKS = ("__torch_function__", "__torch_dispatch__", "copy_")
_DEFAULTS = {name: {inspect.getattr_static(c, name) for c in (torch.Tensor, torch.nn.Parameter)}
             for name in _HOOKS}


def _plain_copy(target: torch.Tensor) -> bool:
    """Whether ``copy_`` into ``target`` is PyTorch's own kernel on CPU/CUDA: no Python
    of a tensor subclass, no other backend (which may allocate or run code)."""
    cls = type(target)
    return target.device.type in ("cpu", "cuda") and all(
        inspect.getattr_static(cls, name) in _DEFAULTS[name] for name in _HOOKS)


def _check_copy(target: torch.Tensor, source: torch.Tensor, path: str) -> None:
    """Refuse, before anything is changed, a copy into ``target`` that would fail."""
    if target.is_inference() and not torch.is_inference_mode_enabled():
        raise CheckpointUsageError(
            f"'{path}' is an inference tensor (made under torch.inference_mode), which "
            "cannot be changed in place outside inference mode; Module.load_state_dict "
            "refuses it too. Load inside torch.inference_mode(), or rebuild the module "
            "outside it. Nothing was loaded."
        )
    if any(stride == 0 and size > 1 for stride, size in zip(target.stride(), target.shape)):
        raise CheckpointUsageError(
            f"'{path}' is a tensor whose elements share memory (expanded: stride 0), "
            "which cannot be copied into; Module.load_state_dict refuses it too. Make it "
            "a tensor of its own (.clone()) before loading. Nothing was loaded."
        )
    if _compat.is_traceable_wrapper_subclass(target):  # DTensor, Float8, NF4, ...
        raise CheckpointUsageError(
            f"'{path}' is a real {type(target).__qualname__} (a tensor subclass wrapping other "
            "tensors, such as a DTensor of a materialized FSDP2 or tensor-parallel model): "
            "torchdefer.load_state_dict copies into plain real tensors, and loads sharded "
            "models while their shards are deferred. Load before materializing, or use "
            "torch.distributed.checkpoint.state_dict.set_model_state_dict. Nothing was loaded."
        )
    if target.is_meta:  # (a checkpoint of meta tensors is refused earlier, by check_entries)
        raise CheckpointUsageError(
            f"'{path}' is a real tensor on the meta device, which holds no values: "
            "copying into it would load nothing (Module.load_state_dict only warns). Build "
            "the model with torchdefer.deferred_init instead of on the meta device, or "
            "move it to a device first (module.to_empty(device='cpu')). Nothing was loaded."
        )
    if (source.shape, source.dtype, source.device) != (target.shape, target.dtype, target.device):
        raise CheckpointUsageError(  # prepare() converts: a caller's bug, never a file's
            f"'{path}': the prepared tensor ({tuple(source.shape)}, {source.dtype}, "
            f"{source.device}) does not match the module's ({tuple(target.shape)}, "
            f"{target.dtype}, {target.device}). Nothing was loaded."
        )


def _span(t: torch.Tensor) -> tuple[tuple[torch.device, int], tuple[int, int]] | None:
    """``((device, storage), (first byte, end byte))`` of the memory ``t`` may touch."""
    if t.numel() == 0 or t.is_meta:
        return None
    size = t.element_size()
    first = int(t.storage_offset()) * size  # real tensors: no SymInts
    extent = int(sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))) + 1
    return (t.device, t.untyped_storage().data_ptr()), (first, first + extent * size)


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.device == b.device and a.storage_offset() == b.storage_offset()
            and a.stride() == b.stride() and a.shape == b.shape and a.dtype == b.dtype)


def _few(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:5])
    return (shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")) or "none"


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold SIGINT while the commit runs; deliver it, once, when the commit is over.

    Python runs signal handlers in the main thread only, so elsewhere there is
    nothing to hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.getsignal(signal.SIGINT)
        received: list[int] = []
        if previous is None:  # a handler set from C: it cannot be put back, leave it
            raise ValueError
        signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    except (ValueError, TypeError):  # not the main interpreter, or a C handler
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            _deliver(previous)


def _deliver(handler: Any) -> None:
    """Give the held SIGINT to ``handler`` here, in this frame.

    A callable (Python's default raises ``KeyboardInterrupt``) is called now,
    so the exception starts from the commit's frame whatever the interpreter
    runs next; ``SIG_IGN`` (a process started in the background by a
    non-interactive shell inherits it) ignores it, as it would have;
    ``SIG_DFL`` gets the signal itself (the process ends, as it would have).
    """
    if callable(handler):
        handler(signal.SIGINT, sys._getframe(1))
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signal.SIGINT)
