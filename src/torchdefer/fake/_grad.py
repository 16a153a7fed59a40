"""Autograd for calls that touch a fake device this process lacks (CUDA on a CPU build).

Autograd asks a device's guard for a stream when it records a node, and a
CPU-only build has no CUDA guard: the process aborts. Such calls therefore run
under ``no_grad``, and the outputs are given the autograd metadata eager code
would give them. That metadata comes from the same call made on meta "twins"
of the arguments (same sizes, strides, dtype, ``requires_grad``, leafness),
where autograd runs for real: which outputs require grad follows every op's
own derivative rules (``zeros_like``, ``detach``, ``argmax``, ``new_*`` do
not; ``linear``, views, ``svd`` factors do), and what eager refuses (an
in-place write to a leaf that requires grad) raises the same error.

An output that eager would give a ``grad_fn`` is a leaf here; it is marked, so
that ``t.is_leaf`` answers as eager and ``t.requires_grad_(False)`` raises as
eager does. ``t.grad_fn`` stays None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from torchdefer import _compat
from torchdefer.fake._layout import meta_twin
from torchdefer.fake._output_device import device_available, normalize
from torchdefer.fake._outside import no_fake_modes

__all__ = ["LEAFNESS_ASKS", "NONLEAF", "NOT_HANDLED", "call_without_autograd", "leafness",
           "on_twins", "runs_on_twins", "touches_missing_device"]

# Key in a fake tensor's __dict__: eager would have made it a non-leaf.
NONLEAF = "_torchdefer_nonleaf"
_IS_LEAF = _compat.descriptor_get(_compat.TensorBase, "is_leaf")
_SET_REQUIRES_GRAD = _compat.descriptor_set(_compat.TensorBase, "requires_grad")
NOT_HANDLED = object()  # leafness: not a call it answers
LEAFNESS_ASKS = frozenset({torch.Tensor.requires_grad_, _SET_REQUIRES_GRAD, _IS_LEAF})
"""The functions :func:`leafness` may answer (for any other it returns ``NOT_HANDLED``):
``call_grad_safe`` asks this set before it calls it, for every call."""


def leafness(func: Any, args: tuple, kwargs: dict) -> Any:
    """Eager's answer to ``t.is_leaf`` / ``t.requires_grad_(False)`` for a marked tensor.

    Returns ``NOT_HANDLED`` for any other call (the caller goes on as usual).
    """
    # The function first: it is one of these three for few calls, and reading the
    # mark builds nothing then (this runs for every call on a fake tensor).
    if func is torch.Tensor.requires_grad_:
        asks = "requires_grad_"
    elif func == _SET_REQUIRES_GRAD:
        asks = "set"
    elif func == _IS_LEAF:
        asks = "is_leaf"
    else:
        return NOT_HANDLED
    if not args or not getattr(args[0], "__dict__", {}).get(NONLEAF, False):
        return NOT_HANDLED
    if asks == "is_leaf":
        return False
    if asks == "requires_grad_":
        value = args[1] if len(args) > 1 else kwargs.get("requires_grad", True)
    else:
        value = args[1]
    if not value:
        raise RuntimeError(
            "you can only change requires_grad flags of leaf variables. If you want to use "
            "a computed variable in a subgraph that doesn't require differentiation use "
            "var_no_grad = var.detach()."
        )
    return NOT_HANDLED


def touches_missing_device(args: tuple, kwargs: dict) -> bool:
    """Whether a tensor argument lives on, or a device argument names, a missing device."""
    # Plain loops, not a generator: this runs for every recorded call of a parameter.
    for group in (args, kwargs.values()):
        for a in group:
            if isinstance(a, (list, tuple)):
                for b in a:
                    if _on_missing_device(b):
                        return True
            elif _on_missing_device(a):
                return True
    device = kwargs.get("device")
    if isinstance(device, (str, int)):
        return not device_available(normalize(torch.device(device)))
    return False


def call_without_autograd(func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` under no_grad, outputs given eager's autograd metadata."""
    grads = _eager_autograd(func, args, kwargs)
    with torch.no_grad():
        out = func(*args, **kwargs)
    outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
    if grads is None or len(grads) != len(outs):
        # The meta twins could not run it: differentiable dtypes require grad.
        grads = [(o.is_floating_point() or o.is_complex(), False) for o in outs]
    for o, (requires_grad, is_leaf) in zip(outs, grads, strict=True):
        if o.requires_grad != requires_grad:
            o.__dict__.pop(NONLEAF, None)
            o.requires_grad_(requires_grad)
        if requires_grad and not is_leaf and hasattr(o, "fake_device"):
            o.__dict__[NONLEAF] = True
    return out


def _eager_autograd(func: Callable[..., Any], args: tuple, kwargs: dict):
    """``(requires_grad, is_leaf)`` per tensor output of the call on meta twins.

    Raises what eager autograd would raise for the call; None when the twins
    cannot say (no meta kernel, a data-dependent op).
    """
    try:
        out = on_twins(func, args, kwargs)
    except Exception as error:
        try:
            with torch.no_grad():
                on_twins(func, args, kwargs)
        except Exception:
            return None
        raise error from None  # autograd's own refusal, as eager raises it
    return [(o.requires_grad, o.is_leaf) for o in tree_leaves(out) if isinstance(o, torch.Tensor)]


def on_twins(func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``func`` run as eager code on meta twins of its arguments (an inference
    tensor's twin is one, whatever mode the call runs in); raises what they raise."""
    with no_fake_modes():
        return func(*_twins(args), **_twins(kwargs))


def runs_on_twins(func: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
    """Whether the call runs on meta twins of its arguments, autograd included."""
    try:
        return _eager_autograd(func, args, kwargs) is not None
    except Exception:  # autograd's own refusal on the twins
        return False


def _twins(tree: Any) -> Any:
    if isinstance(tree, dict) and isinstance(tree.get("device"), (str, int)):
        tree = {**tree, "device": "meta"}
    return tree_map(_twin, tree)


def _twin(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        # A twin is an inference tensor where ``x`` is one, whatever mode the call runs in.
        with _compat.DisableTorchFunctionSubclass(), torch.inference_mode(x.is_inference()):
            twin = meta_twin(x)
            if not x.requires_grad:
                return twin
            twin.requires_grad_(True)
            if not _is_leaf(x) or getattr(x, "__dict__", {}).get(NONLEAF, False):
                twin = twin.clone()  # a non-leaf, as eager's
        return twin
    if isinstance(x, torch.device) and x.type != "meta":
        return torch.device("meta")
    return x


def _is_leaf(x: torch.Tensor) -> bool:
    try:
        return x.is_leaf
    except (RuntimeError, IndexError):  # autograd could not rebuild a view's history
        # (IndexError: the base lost the dim the view was taken on, resize_): a view is no leaf
        return False


def _on_missing_device(x: Any) -> bool:
    """Whether ``x`` is a tensor on, or a device naming, a device this process lacks."""
    if isinstance(x, torch.Tensor):
        device = getattr(x, "fake_device", None)
        return device is not None and not device_available(device)
    return isinstance(x, torch.device) and not device_available(normalize(x))
