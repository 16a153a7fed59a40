"""The last step of a load: every change to the module, checked first, then made all together.

A load changes a module in three ways: deferred tensors the checkpoint fills
become the loaded tensors, deferred tensors it lacks become their replay, and
tensors already real are copied into. :class:`Installation` collects them
(``stage_*``), checking on the way everything that could refuse (a swap
PyTorch would not make, a copy eager would not make), and :meth:`commit` makes
them. A swap that still fails undoes those made before it, so a load that
raises leaves every tensor as it was.

What this module deliberately does not do: keep a copy of tensors already
real. Their copies run last, after checks that cover what makes ``copy_``
refuse here (an inference tensor outside inference mode, an expanded
tensor); a copy failing for another reason leaves the earlier
copies made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from torchdefer.checkpoint.errors import CheckpointUsageError
from torchdefer.materialize.api import mark_materialized
from torchdefer.materialize.cache import keep_loaded
from torchdefer.materialize.swap import check_swap, exchange, shell_for, undo
from torchdefer.recorder.graph import Value
from torchdefer.recorder.tensor import DeferredTensor

__all__ = ["Installation"]


@dataclass(slots=True)
class _Swap:
    target: DeferredTensor  # the module's deferred tensor object
    shell: torch.Tensor  # the real tensor object it exchanges everything with
    path: str
    real: torch.Tensor  # what the target becomes (for the cache and the flag)
    value: Value  # the target's recorded value
    loaded: bool  # from the checkpoint (kept for views of it) or replayed


class Installation:
    """The changes of one load, all checked before :meth:`commit` makes the first.

    >>> import torch, torchdefer
    >>> from torchdefer.checkpoint.install import Installation
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
        self._copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._grads: list[tuple[torch.Tensor, torch.Tensor]] = []

    def stage_loaded(self, target: torch.Tensor, real: torch.Tensor, path: str) -> None:
        """``target`` (deferred: becomes ``real``; real: ``real`` is copied into it)."""
        if isinstance(target, DeferredTensor):
            self._stage_swap(target, real, path, loaded=True)
        else:
            _check_copy(target, path)
            self._copies.append((target, real))

    def stage_replayed(self, target: DeferredTensor, real: torch.Tensor, path: str) -> None:
        """A tensor the checkpoint lacks, replayed from the recording."""
        self._stage_swap(target, real, path, loaded=False)

    def stage_grads(self, grads: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """``(parameter, grad)`` pairs to put back once swapped (a grad lives on the impl)."""
        self._grads.extend(grads)

    def commit(self, then: Callable[[], None] | None = None) -> None:
        """Make every staged change; a failure undoes the swaps made, and raises.

        ``then`` runs after the swaps and before the copies; if it raises, the
        swaps are undone too (the tensors that need the loaded ones in place).
        """
        done: list[_Swap] = []
        undo_cache: list[Callable[[], None]] = []
        try:
            for swap in self._swaps:
                exchange(swap.target, swap.shell, swap.path)
                done.append(swap)
            for swap in self._swaps:
                if swap.loaded:
                    # target is the loaded tensor now: views of it are rebuilt over it
                    undo_cache.append(keep_loaded(swap.value, swap.target))
            if then is not None:
                then()
        except BaseException:
            for restore in reversed(undo_cache):
                restore()
            for swap in reversed(done):
                undo(swap.target, swap.shell, swap.path)
            raise
        for swap in self._swaps:
            mark_materialized(swap.value, swap.real)
        with torch.no_grad():
            for parameter, grad in self._grads:
                parameter.grad = grad
            for target, real in self._copies:
                target.copy_(real)
        self._swaps, self._copies, self._grads = [], [], []

    def _stage_swap(self, target: DeferredTensor, real: torch.Tensor, path: str,
                    loaded: bool) -> None:
        shell = shell_for(target, real, path)
        check_swap(target, shell, path)
        self._swaps.append(_Swap(target, shell, path, real, target._value, loaded))


def _check_copy(target: torch.Tensor, path: str) -> None:
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
