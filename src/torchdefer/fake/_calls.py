"""Calling torch on fake tensors whose device this host lacks (CUDA on a CPU build).

Two things in PyTorch touch a device before our dispatch sees a call, and a
CPU-only build has no CUDA "device guard" for them (PyTorch's own
``FakeTensorMode`` fails the same way):

* a few Python bindings take a guard for their tensor argument
  (``copy_``, ``to``, indexing, ``contiguous``, ``new_tensor``);
* autograd asks the guard for a stream when it records a node.

``call_grad_safe`` routes those calls around the guard; everything else is
called as is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from torchdefer import _compat
from torchdefer.errors import TorchdeferError
from torchdefer.fake._grad import (
    LEAFNESS_ASKS,
    NOT_HANDLED,
    call_without_autograd,
    leafness,
    runs_on_twins,
    touches_missing_device,
)
from torchdefer.fake._output_device import device_available
from torchdefer.fake._source import user_frame
from torchdefer.fake._state import STATE
from torchdefer.fake._tensor import FakeTensor, FakeTensorError, flat_tensors

__all__ = ["GUARDED", "call_grad_safe", "set_refusing_lost_view_history"]

# Autograd's own refusals about views and in-place ops: eager raises them too.
_EAGER_AUTOGRAD_ERRORS = re.compile(
    r"in-place operation|modified inplace|view was created|custom Function|requires_grad flags")
# Autograd rebuilding a view's grad_fn by replaying its view op (variable.cpp);
# eager rebuilds with as_strided and never reaches it.
_HISTORY_ASSERT = "new_fn INTERNAL ASSERT FAILED"

# Python bindings that take a device guard for their tensor argument before
# dispatching (python_variable_methods.cpp, python_variable_indexing.cpp). A
# CPU-only build has no CUDA guard: PyTorch's own FakeTensorMode fails there.
# Found by running every OpInfo sample on fake CUDA tensors (nonzero's binding
# is handwritten, python_torch_functions_manual.cpp).
GUARDED: frozenset[Callable[..., Any]] = frozenset(
    {
        torch.Tensor.__getitem__,
        torch.Tensor.__setitem__,
        torch.Tensor.contiguous,
        torch.nonzero,
        torch.Tensor.nonzero,
    }
)


def call_grad_safe(func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Call ``func``; if autograd would touch a fake device this process lacks, don't.

    Autograd asks the device's guard for a stream when it builds a graph node,
    and a CPU-only build has no CUDA guard (the process aborts). Such calls run
    under ``no_grad`` and the outputs get the ``requires_grad`` eager would give.
    """
    try:
        asks_leafness = func in LEAFNESS_ASKS
        rerouted = func in _REROUTED
    except TypeError:  # an unhashable callable: ask each case
        asks_leafness = rerouted = True
    if asks_leafness:
        answer = leafness(func, args, kwargs)
        if answer is not NOT_HANDLED:
            return answer
    if rerouted:
        answer, call = _reroute(func, args, kwargs)
        if call is None:
            return answer
        func, args, kwargs = call
    if (
        torch.is_grad_enabled()
        and _any_requires_grad(args, kwargs)
        and touches_missing_device(args, kwargs)
    ):
        return call_without_autograd(func, args, kwargs)
    try:
        out = func(*args, **kwargs)
    except (RuntimeError, IndexError) as e:  # IndexError: a view's dim gone after resize_
        if not _lost_view_history(e, func, args, kwargs):
            raise
        raise _view_history_error(func, e) from e
    return out


def _any_requires_grad(args: tuple, kwargs: dict) -> bool:
    """``any(t.requires_grad for t in flat_tensors(args, kwargs))`` as plain loops: it
    runs for every recorded call, where a generator and its expression cost ~1 µs."""
    for group in (args, kwargs.values()):
        for a in group:
            if isinstance(a, torch.Tensor):
                if a.requires_grad:
                    return True
            elif isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, torch.Tensor) and b.requires_grad:
                        return True
    return False


def _reroute(func: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """For a function of ``_REROUTED`` (or an unhashable one): ``(answer, None)``, or
    ``(None, (func, args, kwargs))``, the call ``call_grad_safe`` makes instead."""
    # The Python bindings of copy_ and to() take a device guard before they
    # dispatch, and a CPU-only build has no CUDA guard (PyTorch's own
    # FakeTensorMode fails the same way); the ops themselves take none on the
    # way to our dispatch, so call them directly.
    if func is torch.Tensor.copy_:
        func = _copy_
    elif func is torch.Tensor.type:
        # .to() in disguise (a legacy type name such as torch.cuda.FloatTensor),
        # whose binding initializes CUDA first.
        as_to = _as_to(args, kwargs)
        if as_to is not None:
            rerouted = _to_missing_device(torch.Tensor.to, *as_to)
            if rerouted is not None:
                func, args, kwargs = rerouted
    elif func is torch.Tensor.to or func is torch.Tensor.cuda:
        rerouted = _to_missing_device(func, args, kwargs)
        if rerouted is not None:
            func, args, kwargs = rerouted
    elif func is torch.Tensor.new_tensor and not device_available(args[0].fake_device):
        return _new_tensor(*args, **kwargs), None  # a new leaf: no autograd involved
    elif func in GUARDED and not STATE.guarded:
        STATE.guarded = True
        try:
            return call_grad_safe(func, args, kwargs), None
        finally:
            STATE.guarded = False
    return None, (func, args, kwargs)


# What call_grad_safe reroutes or answers itself (anything else is called as
# is): one set lookup, not seven tests, for the other calls.
_REROUTED = frozenset({torch.Tensor.copy_, torch.Tensor.type, torch.Tensor.to, torch.Tensor.cuda,
                       torch.Tensor.new_tensor, *GUARDED})


def _lost_view_history(error: Exception, func: Callable[..., Any], args: tuple,
                       kwargs: dict) -> bool:
    """Whether ``error`` is autograd failing to rebuild a view argument's history.

    Autograd rebuilds the ``grad_fn`` of a view that requires grad after an
    in-place change. On tensors with Python dispatch it replays the view's
    own ops on the base (eager uses ``as_strided``): that fails when the base
    changed shape or storage (``set_``, ``resize_``, ``.data =``), and asserts after an
    in-place reshape of a view of a view under ``no_grad``; PyTorch's
    ``FakeTensorMode`` fails alike. The failure leaves the view's autograd
    state unreadable, so it is told apart from errors eager raises too: it is
    not one of autograd's own refusals, and the same call runs on meta twins,
    which have no such history.
    """
    message = str(error)
    if isinstance(error, TorchdeferError) or _EAGER_AUTOGRAD_ERRORS.search(message):
        return False
    if not any(t._is_view() for t in flat_tensors(args, kwargs)):
        return False
    # The twins cannot run an op with no meta kernel (unique, nonzero: their
    # output size depends on the data); autograd's assert on the view's
    # history, raised before the op runs, tells it there.
    return _HISTORY_ASSERT in message or runs_on_twins(func, args, kwargs)


def set_refusing_lost_view_history(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Tensor.set_`` that refuses, as :func:`call_grad_safe` does, a source view whose
    history autograd cannot rebuild on fake tensors.

    ``set_``'s Python binding takes no ``__torch_function__``, and its autograd
    kernel asks the source's ``grad_fn`` before dispatching: the failure
    (PyTorch's "new_fn INTERNAL ASSERT FAILED") reaches no hook of ours. The
    recorder installs this while a recording runs (``recorder._threads``).
    """

    def set_(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        try:
            return original(self, *args, **kwargs)
        except (RuntimeError, IndexError) as e:
            fakes = [t for t in flat_tensors((self, *args), kwargs) if isinstance(t, FakeTensor)]
            if not fakes or not _lost_view_history(e, original, (self, *args), kwargs):
                raise
            raise _view_history_error(set_, e) from e

    set_.__name__ = set_.__qualname__ = "set_"
    set_.__doc__ = original.__doc__
    return set_


def _view_history_error(func: Callable[..., Any], error: Exception) -> FakeTensorError:
    where = user_frame(2)
    at = f" at {where.file}:{where.line}" if where else ""
    first = (str(error).strip().splitlines() or [""])[0]
    return FakeTensorError(
        f"{getattr(func, '__name__', func)}{at}: PyTorch's autograd cannot rebuild the history "
        f"of a view passed to it on fake tensors ({first}). It is a view of a tensor that "
        "requires grad, used after an in-place change: its base changed shape or storage "
        "(set_, resize_, .data = ...), or it is a view of a view and it was reshaped in "
        "place (unsqueeze_, t_, as_strided_) or its base written (copy_, fill_) under "
        "torch.no_grad(). Eager rebuilds the history with as_strided; on fake tensors "
        "(PyTorch's own FakeTensorMode too) autograd replays the view's ops. Take the view "
        "again after the change, change the tensor out of place (v = v.unsqueeze(0)), or "
        "clone() the tensor before requires_grad_()")


def _new_tensor(self: FakeTensor, data: Any, dtype=None, device=None, requires_grad=False, **kw):
    """``t.new_tensor(data)`` as ``torch.tensor(data, ...)`` with ``t``'s dtype and fake device."""
    return torch.tensor(
        data,
        dtype=dtype or self.dtype,
        device=device or self.fake_device,
        requires_grad=requires_grad,
        **kw,
    )


def _copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return torch.ops.aten.copy_.default(self, src, non_blocking)


def _as_to(args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """``t.type(T)`` as ``t.to(...)`` arguments, or None (``t.type()`` asks a name)."""
    self, rest = args[0], args[1:]
    name = rest[0] if rest else kwargs.get("dtype")
    if name is None:
        return None  # t.type(): the type name, answered without a device
    if isinstance(name, torch.dtype):
        return (self, name), {}
    name = name if isinstance(name, str) else f"{name.__module__}.{name.__name__}"
    cuda = name.startswith("torch.cuda.")
    legacy = getattr(torch.cuda if cuda else torch, name.rsplit(".", 1)[-1], None)
    dtype = getattr(legacy, "dtype", None)
    if not isinstance(dtype, torch.dtype):
        return None
    return (self,), {"device": torch.device("cuda" if cuda else "cpu"), "dtype": dtype}


def _to_missing_device(func, args: tuple, kwargs: dict):
    """``t.to(...)``/``t.cuda()`` from or to a device this host lacks, as ``_to_copy``."""
    from torchdefer.fake._output_device import normalize

    self, rest = args[0], args[1:]
    kwargs = dict(kwargs)
    if func is torch.Tensor.cuda:
        index = rest[0] if rest else kwargs.pop("device", None)
        device: Any = torch.device("cuda", index) if isinstance(index, int) else index or "cuda"
        rest, kwargs = (device,), {"non_blocking": kwargs.get("non_blocking", False)}
    copy = bool(kwargs.pop("copy", False))
    device, dtype, non_blocking, memory_format = _compat.parse_to(*rest, **kwargs)
    device = self.device if device is None else normalize(device)
    if device_available(device) and device_available(self.device):
        return None
    same = device == self.device and (dtype is None or dtype == self.dtype)
    if same and not copy and memory_format in (None, torch.preserve_format):
        return (lambda t: t), (self,), {}
    options = {"dtype": dtype or self.dtype, "device": device, "non_blocking": non_blocking}
    if memory_format is not None:
        options["memory_format"] = memory_format
    return torch.ops.aten._to_copy.default, (self,), options
