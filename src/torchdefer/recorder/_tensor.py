"""DeferredTensor: a fake tensor whose every op is recorded into its graph.

Its calls are answered by the recorder through ``recorder._entries`` (the
recorder builds deferred tensors, so it imports this module, not the reverse).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch

from torchdefer import _compat
from torchdefer._hooks import VALUE_READER
from torchdefer.errors import InternalError
from torchdefer.fake._calls import call_grad_safe
from torchdefer.fake._grad import NOT_HANDLED, leafness
from torchdefer.fake._storage_objects import STORAGE_GETTERS, adopt
from torchdefer.fake._storage_objects import data_ptr as fake_data_ptr
from torchdefer.fake._tensor import (
    DATA_READS,
    FakeTensor,
    flat_tensors,
    not_picklable,
    reported_device,
)
from torchdefer.recorder._collectives import refuse_collective
from torchdefer.recorder._entries import ENTRIES
from torchdefer.recorder._graph import Graph, Value
from torchdefer.recorder._mode import RecordingMode

__all__ = ["DATA_GET_CALL", "PRIVATE_ATTRIBUTES", "DeferredTensor", "graph_of", "holds_deferred"]

# What torchdefer keeps in a deferred tensor's __dict__; everything else the
# user (or a library) set, and it travels with copies and to the real tensor.
PRIVATE_ATTRIBUTES = frozenset({"_graph", "_value", "fake_device", "_materialized", "_homes"})

_FAKE = _compat.FAKE_MODE_KEY
_NO_CONTEXT = contextlib.nullcontext()
_DATA_GET = _compat.descriptor_get(torch.Tensor, "data")
_DATA_SET = _compat.descriptor_set(torch.Tensor, "data")
_DETACH = torch.Tensor.detach
_IS_META = _compat.descriptor_get(torch.Tensor, "is_meta")
_GRAD_FN = _compat.descriptor_get(torch.Tensor, "grad_fn")
_GRAD_FN_SET = _compat.descriptor_set(torch.Tensor, "grad_fn")  # refuses, in torch's words
_REQUIRES_GRAD_ = torch.Tensor.requires_grad_


def _grad_fn(t: torch.Tensor) -> Any:
    """``t.grad_fn``: torch's getter with subclass handling off (no dispatch, no
    autograd node, no device: nothing of ``__torch_function__`` applies)."""
    with _compat.DisableTorchFunctionSubclass():
        return _GRAD_FN(t)


def _requires_grad_(t: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    """``t.requires_grad_(requires_grad)`` outside inference mode: eager's refusal to
    un-require grad of a marked non-leaf (``fake._grad.leafness``), else torch's
    method with subclass handling off."""
    answer = leafness(_REQUIRES_GRAD_, (t, requires_grad), {})
    if answer is not NOT_HANDLED:
        return answer
    with _compat.DisableTorchFunctionSubclass():
        return _REQUIRES_GRAD_(t, requires_grad)


def _plain_requires_grad(args: tuple, kwargs: dict) -> bool:
    """Whether ``requires_grad_``'s arguments after the tensor are ``()``, ``(flag,)``
    or ``requires_grad=flag``: the forms :func:`_requires_grad_` takes."""
    return len(args) + len(kwargs) <= 1 and (not kwargs or "requires_grad" in kwargs)


class DeferredTensor(FakeTensor):
    """A fake tensor that belongs to a recorded :class:`Graph`.

    ``_value`` is the graph value the tensor holds now; an op that changes the
    tensor's metadata in place (``t_()``) or rebinds it (``.data = x``) moves it
    to a new value. Ops on it are recorded also after ``deferred_init`` has
    returned (``model.half()``, ``apply(init_fn)``, weight tying). Outside the
    recorder, ask :func:`torchdefer.recorder.target_of` what it stands for.
    """

    _graph: Graph
    _value: Value

    @staticmethod
    def __new__(
        cls, elem: torch.Tensor, device: torch.device | None = None, requires_grad: bool = True
    ) -> DeferredTensor:
        if device is None:
            # `type(param)(data, requires_grad=...)`: how accelerate's
            # set_module_tensor_to_device (and bitsandbytes) rebuild a parameter
            # around loaded data. The result is real, so a plain Parameter.
            return torch.nn.Parameter(elem, requires_grad=requires_grad)  # type: ignore[return-value]
        return FakeTensor.__new__(cls, elem, device)  # type: ignore[return-value]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Two calls made for every parameter (nn.Parameter(t) sets requires_grad_,
        # nn.Module.register_parameter asks grad_fn; the class's own grad_fn and
        # requires_grad_ answer them, here only when called as torch.Tensor's or
        # under a torch-function mode) that dispatch nothing, make no autograd node
        # and name no device: none of the steps below apply but eager's refusal to
        # un-require grad of a marked non-leaf.
        if func == _GRAD_FN:
            return _grad_fn(*args)
        if (func is _REQUIRES_GRAD_ and not torch.is_inference_mode_enabled()
                and _plain_requires_grad(args[1:], kwargs)):
            return _requires_grad_(*args, **kwargs)
        try:
            # detach() of a plain deferred tensor is ordinary; of a subclass (a
            # parameter), answered below. Every nn.Parameter(...) detaches.
            ordinary = (func in _ordinary or (func is _DETACH and type(args[0]) is DeferredTensor)
                        ) and "out" not in kwargs
            # In-place writes (nn.init's functions, fill_) are ordinary while recording.
            recorded_write = not ordinary and func in _ordinary_writes and "out" not in kwargs
        except TypeError:  # an unhashable callable
            ordinary = recorded_write = False
        if (ordinary or recorded_write) and isinstance(_compat.get_dispatch_mode(_FAKE),
                                                       RecordingMode):
            # The common case inside deferred_init: nothing before or after the call.
            with _compat.DisableTorchFunctionSubclass():
                return call_grad_safe(func, args, kwargs)
        if not ordinary:
            if func is _DETACH and type(args[0]) is not DeferredTensor:
                # recorder.subclasses; reads its caller's frame: called here
                return ENTRIES.detach_for_parameter(args[0])
            answer = _special_call(func, args, kwargs)
            if answer is not _NOT_SPECIAL:
                return answer
        # Inside deferred_init a recording is active; after it, record into our graph.
        active = isinstance(_compat.get_dispatch_mode(_FAKE), RecordingMode)
        data_get = func == _DATA_GET
        if data_get:  # torch's getter dispatches a detach: recorded as this DATA_GET
            DATA_GET_CALL.active = True
        try:
            with (
                _NO_CONTEXT if active else RecordingMode(graph_of(args, kwargs)),
                _compat.DisableTorchFunctionSubclass(),
            ):
                out = call_grad_safe(func, args, kwargs)
        finally:
            if data_get:
                DATA_GET_CALL.active = False
        if func in STORAGE_GETTERS:
            return adopt(out, args[0], args[0].fake_device)
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.prim.device.default:
            return reported_device(args[0])
        # recorder.record.record_call; refuses collectives (OpFacts.collective)
        return ENTRIES.record_call(graph_of(args, kwargs or {}), func, args, kwargs or {})

    # The calls made of every parameter (nn.Parameter(t) calls detach and
    # requires_grad_, Module.register_parameter reads grad_fn), answered before
    # __torch_function__ is entered (~3 µs each in a large build): torch's own
    # getter and methods with subclass handling off, so a torch-function mode
    # still sees them first, as in eager. A user Parameter subclass's own ones win
    # (deferred_class).
    grad_fn = property(_grad_fn, _GRAD_FN_SET, lambda self: _GRAD_FN_SET(self, None))

    # Any call but the plain form goes to torch's method (through
    # __torch_function__): a wrong argument gets torch's own words, as in eager.
    def requires_grad_(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if (torch.is_inference_mode_enabled() or _compat.torch_function_mode_enabled()
                or not _plain_requires_grad(args, kwargs)):
            return _REQUIRES_GRAD_(self, *args, **kwargs)  # through __torch_function__
        return _requires_grad_(self, *args, **kwargs)

    def detach(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        # Every nn.Parameter(t) detaches t: where __torch_function__ would take its
        # ordinary path (a plain deferred tensor, a recording active), taken
        # without entering it; a torch-function mode must see the call first.
        if (type(self) is DeferredTensor and not args and not kwargs
                and not _compat.torch_function_mode_enabled()
                and isinstance(_compat.get_dispatch_mode(_FAKE), RecordingMode)):
            with _compat.DisableTorchFunctionSubclass():
                return call_grad_safe(_DETACH, (self,), {})
        return _DETACH(self, *args, **kwargs)

    # A deferred parameter is an instance of a deferred class that derives from
    # nn.Parameter (or the user's Parameter subclass): see recorder/_subclasses.py.
    # nn.Parameter(deferred) ends with `t._is_param = True`; that is where the
    # class is given.
    @property
    def _is_param(self) -> bool:
        return issubclass(type(self), torch.nn.Parameter)

    @_is_param.setter
    def _is_param(self, value: bool) -> None:
        if value:  # every nn.Parameter(...) ends here
            ENTRIES.make_parameter(self)  # recorder.subclasses

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        return ENTRIES.deepcopy_deferred(self, memo)  # recorder._copy

    def __copy__(self) -> torch.Tensor:
        return ENTRIES.shallow_copy_deferred(self)  # recorder._copy

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise not_picklable(self)


class _DataGetCall(threading.local):
    active = False


DATA_GET_CALL = _DataGetCall()
"""``.active``: this thread's ``t.data`` is being recorded; its detach is the
``DATA_GET`` node (``recorder._fast.fast_detach`` reads it when it makes the node)."""


# Functions that need none of _special_call's cases whatever their arguments,
# nor __torch_function__'s after the call (all but in-place writes, detach,
# data reads, .data, storage getters and a few more): the ~3000 calls of a
# large model's construction skip those checks after the first.
_ordinary: set[Any] = set()
# In-place writes that need none of them while a recording is active (then the
# recorder itself refuses writes into real tensors: ``writes_real`` is False):
# nn.init's functions and fill_, ~1300 calls of the 70B Llama's construction.
_ordinary_writes: set[Any] = set()
_NOT_SPECIAL = object()


def _special_call(func: Any, args: tuple, kwargs: dict) -> Any:
    """A call on deferred tensors that is not simply recorded, answered; else _NOT_SPECIAL."""
    if func is torch.Tensor.__reduce_ex__:
        raise not_picklable(args[0])
    if func == _IS_META:  # never ordinary: torch's trunc_normal_ asks it first
        if not isinstance(_compat.get_dispatch_mode(_FAKE), RecordingMode):
            answer = ENTRIES.library_call_asking_is_meta(args[0])  # recorder.composite
            if answer is not None:
                return answer
        return _NOT_SPECIAL
    if func is torch.Tensor.data_ptr:
        return fake_data_ptr(args[0])
    if func in DATA_READS:
        return ENTRIES.data_read(func, args, kwargs)  # recorder.record
    if func == _DATA_SET:
        return ENTRIES.record_data_set(args[0], args[1])  # recorder.record
    if func is torch.Tensor.__deepcopy__:
        return ENTRIES.deepcopy_deferred(args[0], args[1])  # recorder._copy
    refuse_collective(func)
    if func is _DETACH:  # of a subclass: answered by __torch_function__
        pass
    elif writes_real(func, args, kwargs):
        return write_real(func, args, kwargs)
    elif func != _DATA_GET and func not in STORAGE_GETTERS:
        with contextlib.suppress(TypeError):  # with nothing to do after the call either
            (_ordinary_writes if writes_in_place(func) else _ordinary).add(func)
    return _NOT_SPECIAL


def graph_of(args: Any, kwargs: Any) -> Graph:
    """The graph of the first deferred tensor among the arguments."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, DeferredTensor):
            return a._graph
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, DeferredTensor):
                    return b._graph
    raise InternalError("graph_of() found no deferred tensor among the arguments of a "
                        "recorded call; this is a bug in torchdefer, please report it")


def holds_deferred(t: object) -> bool:
    """A deferred tensor, or a wrapper (DTensor, FSDP2 parameter) around one."""
    if isinstance(t, DeferredTensor):
        return True
    if isinstance(t, torch.Tensor) and _compat.is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return any(holds_deferred(getattr(t, name)) for name in names)
    return False


# ------------------------------------------ writes into real tensors, outside a recording
# (`eager.load_state_dict(deferred.state_dict())` calls `real.copy_(deferred)`):
# eager code writes values there now, so the deferred values are computed (as
# `.item()` is) and written.

def writes_in_place(func: Any) -> bool:
    """Whether ``func`` writes values into its first argument (``add_``, ``+=``)."""
    in_place = _in_place.get(func)
    if in_place is None:
        in_place = _in_place[func] = _writes_first_argument(func)
    return in_place


def writes_real(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``func`` writes values into a real tensor, with no recording active."""
    target = writes_in_place(func) and bool(args) and _is_real(args[0])
    if not target and "out" in kwargs:
        out = kwargs["out"]
        outs = out if isinstance(out, (tuple, list)) else (out,)
        target = any(_is_real(o) for o in outs)
    # Inside deferred_init the recorder refuses such writes, as for any real tensor.
    return target and not isinstance(_compat.get_dispatch_mode(_FAKE), RecordingMode)


_in_place: dict[Any, bool] = {}
# In-place methods that do not write values (or write storage, not values).
_NOT_VALUE_WRITES = frozenset({"requires_grad_", "set_", "share_memory_", "retain_grad"})


def _writes_first_argument(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    if name in _NOT_VALUE_WRITES:
        return False
    if name.endswith("_") and not name.startswith("_"):  # add_, copy_, masked_fill_
        return True
    return name == "__setitem__" or (name.startswith("__i") and name.endswith("__"))  # +=


def write_real(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on real tensors: every deferred argument replaced by its value."""

    def real(x: Any) -> Any:
        return VALUE_READER.get()(x) if isinstance(x, DeferredTensor) else x

    args = tuple(
        type(a)(real(b) for b in a) if isinstance(a, (list, tuple)) else real(a) for a in args
    )
    kwargs = {k: real(v) for k, v in kwargs.items()}
    if any(isinstance(t, FakeTensor) for t in flat_tensors(args, kwargs)):
        return NotImplemented  # a plain fake tensor among them: not ours to compute
    with _compat.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def _is_real(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) and not holds_deferred(t)
