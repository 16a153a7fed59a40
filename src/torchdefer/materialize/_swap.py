"""Turning a deferred tensor object into the real tensor, so that every reference sees it.

Materialization does not reassign module slots: it changes the deferred
object *itself* into the real tensor (its class, ``__dict__`` and
``TensorImpl`` are exchanged with a fresh real tensor's, as
``torch.utils.swap_tensors`` does). Whatever held the object before holds the
real tensor now: tied attributes, ``nn.LSTM._flat_weights``, an optimizer's
``param_groups``, a list of parameters, a hook's closure, a ``weakref``.

``torch.utils.swap_tensors`` itself refuses more than it must for this use:

* a tensor with any Python ``weakref`` (``nn.LSTM`` keeps one to each
  parameter): a weak reference is a reference, and should see the real tensor
  as strong ones do;
* a tensor whose ``TensorImpl`` other tensors hold (a view of it is alive:
  ``w[0]``, ``b = flat[4:]``): the view keeps the deferred impl, which stays
  a valid deferred tensor of the same storage (``materialize_tensor(view)``
  then shares the real storage).

So the exchange is done here, with the one check PyTorch's C++ makes (no C++
weak references to the impl, ``torch._C._WeakTensorRef``); when that
refuses, :class:`SwapError` names the tensor and what to do.
Tensor hooks registered on the deferred tensor (``register_hook``,
``register_post_accumulate_grad_hook``) live on its impl and are installed
again on the real one.
"""

from __future__ import annotations

import contextlib
import copyreg
from typing import Any

import torch

from torchdefer import _compat
from torchdefer.errors import SwapError
from torchdefer.recorder._copy import user_attributes
from torchdefer.recorder._mode import suspended
from torchdefer.recorder._subclasses import user_class

__all__ = ["check_swap", "exchange", "real_tensor", "recorded_inference", "shell_for",
           "swap_in", "undo"]


def recorded_inference(fake: Any) -> bool:
    """Whether the deferred tensor ``fake`` stands for an inference tensor.
    Materialized, it is one exactly then, whatever mode the caller is in.

    The fake tensor object answers as eager's does: made under inference mode,
    or a view of such a tensor. Not its storage's origin: ``t.set_(s)`` with an
    inference tensor ``s`` keeps ``t`` a normal tensor, in eager too."""
    with _compat.DisableTorchFunctionSubclass():
        return bool(fake.is_inference())


def real_tensor(fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """What eager construction would have: ``real``'s data, ``fake``'s class and attributes.

    The class is the user's (``nn.Parameter``, a subclass of it, or a plain
    tensor), made with ``torch.Tensor._make_subclass`` rather than the class's
    own ``__new__`` (which may want other arguments); attributes a library
    set on the deferred tensor (``p.has_fp16_weights``, ``p._no_weight_decay``)
    are copied.
    """
    cls = user_class(fake)  # type: ignore[arg-type]
    with _compat.DisableTorchFunctionSubclass():  # a read, not a call to record
        requires_grad = fake.requires_grad
    # suspended(): materialize_module may run inside deferred_init, whose
    # recording mode would otherwise record these ops on the real tensor.
    # An inference tensor (recorded under inference_mode) takes requires_grad
    # only inside inference mode, as eager's nn.Parameter(...) there did.
    inference = real.is_inference()
    with suspended(), (contextlib.nullcontext() if inference == torch.is_inference_mode_enabled()
                       else torch.inference_mode(inference)):
        if cls is torch.Tensor and requires_grad and not _can_require_grad(real):
            out = _view_of_a_base_requiring_grad(real)
        elif cls is torch.Tensor:
            out = real.detach().requires_grad_(requires_grad)
        else:
            out = _compat.TensorBase._make_subclass(cls, real.detach(), requires_grad)
    out.__dict__.update(user_attributes(fake))
    return out


def _can_require_grad(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def _view_of_a_base_requiring_grad(real: torch.Tensor) -> torch.Tensor:
    """``real`` as an integer tensor that reports ``requires_grad=True``, as eager's did.

    Eager has such tensors: a view taken of ``t`` before ``t.data = <float
    tensor>; t.requires_grad_()`` keeps its dtype and answers ``requires_grad``
    from its autograd base. No tensor of its dtype can be given the flag
    itself, so it is made the same way: a view of a base that then gets float
    data and requires grad (the base keeps an empty float tensor).
    """
    base = real.detach()
    with torch.enable_grad():
        view = base.as_strided(real.size(), real.stride(), real.storage_offset())
    base.data = torch.empty(0, device=real.device)
    base.requires_grad_()
    return view


def swap_in(fake: torch.Tensor, real: torch.Tensor, path: str) -> None:
    """Make the object ``fake`` the real tensor ``real`` stands for, in place.

    Args:
        fake: the deferred tensor object the model holds.
        real: its real tensor (from replay); consumed.
        path: where ``fake`` sits in the module (``layers.3.mlp.weight``), for errors.

    Raises:
        SwapError: PyTorch refused the exchange; nothing was changed.
    """
    exchange(fake, shell_for(fake, real, path), path)


def shell_for(fake: torch.Tensor, real: torch.Tensor, path: str) -> torch.Tensor:
    """The tensor object ``fake`` exchanges everything with (:func:`real_tensor`).

    Raises:
        SwapError: the classes' ``__slots__`` differ, so the exchange cannot be made.
    """
    shell = real_tensor(fake, real)
    if set(copyreg._slotnames(type(fake))) != set(copyreg._slotnames(type(shell))):  # type: ignore[attr-defined]
        raise SwapError(
            f"Cannot make '{path}' real in place: its class {type(fake).__qualname__} has "
            f"__slots__ that {type(shell).__qualname__} lacks. Define the tensor class "
            "without __slots__, or materialize with torchdefer.materialize_tensor and "
            "assign the result."
        )
    return shell


def check_swap(fake: torch.Tensor, shell: torch.Tensor, path: str) -> None:
    """Raise the :class:`SwapError` :func:`exchange` would raise; change nothing.

    With :func:`shell_for` (``__slots__``), every refusal is found: PyTorch's
    own check in ``torch._C._swap_tensor_impl`` (no C++ weak reference to
    either ``TensorImpl``) is asked by exchanging the impls and exchanging
    them back, nothing running in between. Python ``weakref``s, views alive
    and use counts, which ``torch.utils.swap_tensors`` refuses too, are fine
    here (see the module doc).
    """
    _swap_impls(fake, shell, path)
    _compat.swap_tensor_impl(fake, shell)  # back; it refuses only before a first exchange


def exchange(fake: torch.Tensor, shell: torch.Tensor, path: str) -> None:
    """Exchange impl, class, ``__dict__`` and slots of ``fake`` and ``shell``.

    Its own inverse: exchanging again puts both back (:func:`undo`).
    """
    _swap_impls(fake, shell, path)  # first, so that nothing has changed if PyTorch refuses
    fake.__class__, shell.__class__ = shell.__class__, fake.__class__
    fake.__dict__, shell.__dict__ = shell.__dict__, fake.__dict__
    for slot in copyreg._slotnames(type(fake)):  # type: ignore[attr-defined]
        _swap_slot(fake, shell, slot)
    with suspended():
        _reinstall_hooks(fake)


def undo(fake: torch.Tensor, shell: torch.Tensor, path: str) -> None:
    """Undo :func:`exchange`: ``fake`` is the deferred tensor again, ``shell`` the real one."""
    exchange(fake, shell, path)


def _swap_impls(fake: torch.Tensor, shell: torch.Tensor, path: str) -> None:
    try:
        _compat.swap_tensor_impl(fake, shell)
    except RuntimeError as e:
        raise SwapError(
            f"Cannot make '{path}' real in place: PyTorch refuses to swap a tensor whose "
            f"TensorImpl C++ code holds a weak reference to ({e}; torch._C._WeakTensorRef, "
            "or an extension's cache keyed by the tensor). Drop that reference and call "
            "materialize_module again (tensors already done are kept), or take the real "
            "tensor with torchdefer.materialize_tensor and assign it yourself."
        ) from e


def _swap_slot(a: object, b: object, slot: str) -> None:
    missing = object()
    va, vb = getattr(a, slot, missing), getattr(b, slot, missing)
    for target, value in ((a, vb), (b, va)):
        if value is missing:
            if hasattr(target, slot):
                delattr(target, slot)
        else:
            setattr(target, slot, value)


def _reinstall_hooks(tensor: torch.Tensor) -> None:
    # The hook dicts stay with the Python object, but PyTorch runs them
    # through the TensorImpl they were registered on: register them again.
    hooks = tensor._backward_hooks
    if hooks:
        tensor._backward_hooks = hooks
    post = tensor._post_accumulate_grad_hooks
    if post:
        tensor._post_accumulate_grad_hooks = post
