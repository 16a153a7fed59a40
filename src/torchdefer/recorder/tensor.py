"""DeferredTensor: a fake tensor whose every op is recorded into its graph."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from torchdefer import _compat
from torchdefer.errors import InternalError
from torchdefer.fake._calls import call_grad_safe
from torchdefer.fake.storage import STORAGE_GETTERS, adopt
from torchdefer.fake.storage import data_ptr as fake_data_ptr
from torchdefer.fake.tensor import DATA_READS, FakeTensor, not_picklable, reported_device
from torchdefer.recorder._real_targets import (
    refuse_collective,
    write_real,
    writes_in_place,
    writes_real,
)
from torchdefer.recorder.graph import Graph, NodeKind, Value
from torchdefer.recorder.mode import RecordingMode, recorder_entry
from torchdefer.recorder.reach import reached_tensors

__all__ = ["DeferredTensor", "graph_of", "holds_deferred", "is_deferred"]

_FAKE = _compat.FAKE_MODE_KEY
_NO_CONTEXT = contextlib.nullcontext()
_DATA_GET = _compat.descriptor_get(torch.Tensor, "data")
_DATA_SET = _compat.descriptor_set(torch.Tensor, "data")
_DETACH = torch.Tensor.detach
_IS_META = _compat.descriptor_get(torch.Tensor, "is_meta")


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
        try:
            # detach() of a plain deferred tensor is ordinary; of a subclass (a
            # parameter), answered below. Every nn.Parameter(...) detaches.
            ordinary = (func in _ordinary or (func is _DETACH and type(args[0]) is DeferredTensor)
                        ) and "out" not in kwargs
        except TypeError:  # an unhashable callable
            ordinary = False
        if ordinary and isinstance(_compat.get_dispatch_mode(_FAKE), RecordingMode):
            # The common case inside deferred_init: nothing before or after the call.
            with _compat.DisableTorchFunctionSubclass():
                return call_grad_safe(func, args, kwargs)
        if not ordinary:
            if func is _DETACH and type(args[0]) is not DeferredTensor:
                from torchdefer.recorder.subclasses import detach_for_parameter

                return detach_for_parameter(args[0])  # reads its caller's frame: called here
            answer = _special_call(func, args, kwargs)
            if answer is not _NOT_SPECIAL:
                return answer
        # Inside deferred_init a recording is active; after it, record into our graph.
        active = isinstance(_compat.get_dispatch_mode(_FAKE), RecordingMode)
        with (
            _NO_CONTEXT if active else RecordingMode(graph_of(args, kwargs)),
            _compat.DisableTorchFunctionSubclass(),
        ):
            out = call_grad_safe(func, args, kwargs)
        if func == _DATA_GET and isinstance(out, DeferredTensor):
            out._value.node.kind = NodeKind.DATA_GET
        elif func in STORAGE_GETTERS:
            return adopt(out, args[0], args[0].fake_device)
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        record_call = recorder_entry()
        if func is torch.ops.prim.device.default:
            return reported_device(args[0])
        # record_call refuses collectives (OpFacts.collective)
        return record_call(graph_of(args, kwargs or {}), func, args, kwargs or {})

    # A deferred parameter is an instance of a deferred class that derives from
    # nn.Parameter (or the user's Parameter subclass): see recorder/subclasses.py.
    # nn.Parameter(deferred) ends with `t._is_param = True`; that is where the
    # class is given.
    @property
    def _is_param(self) -> bool:
        return issubclass(type(self), torch.nn.Parameter)

    @_is_param.setter
    def _is_param(self, value: bool) -> None:
        if value:  # every nn.Parameter(...) ends here: no import statement per call
            (_make_parameter or _bind_make_parameter())(self)

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        from torchdefer.recorder._copy import deepcopy_deferred

        return deepcopy_deferred(self, memo)

    def __copy__(self) -> torch.Tensor:
        from torchdefer.recorder._copy import shallow_copy_deferred

        return shallow_copy_deferred(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise not_picklable(self)


# recorder.subclasses imports this module: bound at the first parameter made.
_make_parameter: Any = None


def _bind_make_parameter() -> Any:
    global _make_parameter
    from torchdefer.recorder.subclasses import make_parameter

    _make_parameter = make_parameter
    return make_parameter


# Functions that need none of _special_call's cases whatever their arguments,
# nor __torch_function__'s after the call (all but in-place writes, detach,
# data reads, .data, storage getters and a few more): the ~3000 calls of a
# large model's construction skip those checks after the first.
_ordinary: set[Any] = set()
_NOT_SPECIAL = object()


def _special_call(func: Any, args: tuple, kwargs: dict) -> Any:
    """A call on deferred tensors that is not simply recorded, answered; else _NOT_SPECIAL."""
    if func is torch.Tensor.__reduce_ex__:
        raise not_picklable(args[0])
    if func == _IS_META:  # never ordinary: torch's trunc_normal_ asks it first
        from torchdefer.recorder.composite import library_call_asking_is_meta

        if not isinstance(_compat.get_dispatch_mode(_FAKE), RecordingMode):
            answer = library_call_asking_is_meta(args[0])
            if answer is not None:
                return answer
        return _NOT_SPECIAL
    if func is torch.Tensor.data_ptr:
        return fake_data_ptr(args[0])
    if func in DATA_READS:
        from torchdefer.recorder.record import data_read

        return data_read(func, args, kwargs)
    if func == _DATA_SET:
        from torchdefer.recorder.record import record_data_set

        return record_data_set(args[0], args[1])
    if func is torch.Tensor.__deepcopy__:
        from torchdefer.recorder._copy import deepcopy_deferred

        return deepcopy_deferred(args[0], args[1])
    refuse_collective(func)
    if func is _DETACH:  # of a subclass: answered by __torch_function__
        pass
    elif writes_real(func, args, kwargs):
        return write_real(func, args, kwargs)
    elif not writes_in_place(func) and func != _DATA_GET and func not in STORAGE_GETTERS:
        with contextlib.suppress(TypeError):
            _ordinary.add(func)  # with nothing to do after the call either
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


def is_deferred(obj: object) -> bool:
    """Whether a tensor is deferred, or a module still reaches a deferred tensor.

    A module reaches its parameters and buffers, and tensors kept as plain
    attributes, also inside lists, tuples, dicts and sets (what
    ``materialize_module`` materializes; see ``recorder/reach.py``).

    >>> import torch, torchdefer
    >>> m = torchdefer.deferred_init(torch.nn.Linear, 2, 2)
    >>> torchdefer.is_deferred(m), torchdefer.is_deferred(m.weight)
    (True, True)
    """
    if isinstance(obj, torch.nn.Module):
        return any(holds_deferred(r.tensor) for r in reached_tensors(obj))
    return holds_deferred(obj)


def holds_deferred(t: object) -> bool:
    """A deferred tensor, or a wrapper (DTensor, FSDP2 parameter) around one."""
    if isinstance(t, DeferredTensor):
        return True
    if isinstance(t, torch.Tensor) and _compat.is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return any(holds_deferred(getattr(t, name)) for name in names)
    return False
