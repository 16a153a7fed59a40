"""FakeTensor: a tensor that reports a real device but has only meta storage.

Following PyTorch's own ``torch._subclasses.fake_tensor``, the tensor's own
TensorImpl *is* a meta tensor (its "shadow"), created with
``_make_subclass(..., dispatch_device=True)`` so that ``.device`` is answered in
Python with the device the code asked for. Kernels run on the meta backend; the
tensor allocates no storage. Owning the impl (rather than wrapping a separate
meta tensor) is what lets in-place metadata ops such as ``q.t_()`` in
``nn.init.orthogonal_`` change the very object the user holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_map

from torchdefer import _compat
from torchdefer.errors import FakeTensorError, UsageTypeError
from torchdefer.fake._layout import eager_layout
from torchdefer.fake._output_device import (
    device_available,
    device_of,
    first_conflict,
    normalize,
    output_device,
)
from torchdefer.fake._questions import ANSWERS
from torchdefer.fake._state import STATE

__all__ = ["FakeTensor", "FakeTensorError", "factory_on_meta", "is_fake", "run_on_meta"]


_MAKE_SUBCLASS = _compat.TensorBase._make_subclass
_META = torch.device("meta")
_CPU = torch.device("cpu")

# Calls that need a tensor's data. Plain fake tensors have none; the recorder's
# DeferredTensor answers them by materializing just the value needed.
DATA_READS: frozenset[Callable[..., Any]] = frozenset(
    {
        torch.Tensor.tolist,
        torch.Tensor.numpy,
        torch.Tensor.__array__,
        torch.Tensor.item,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__index__,
        torch.Tensor.__complex__,
    }
)


class FakeTensor(torch.Tensor):
    """A tensor with a real device and no storage; ops run on meta kernels."""

    fake_device: torch.device

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device) -> FakeTensor:
        if elem.device.type != "meta":
            raise UsageTypeError(f"FakeTensor(elem, device) needs a meta tensor as elem, got one "
                                 f"on {elem.device}; pass elem.to('meta') (or build fake "
                                 "tensors with torchdefer.fake_mode()).")
        # The C binding itself: inside deferred_init torch.Tensor._make_subclass
        # is recorder.subclasses' wrapper, which passes a meta tensor through.
        out = _MAKE_SUBCLASS(
            cls,
            elem,
            elem.requires_grad,
            dispatch_device=True,
            device_for_backend_keys=device,
        )
        out.fake_device = device
        return out

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        extras = [f"size={tuple(self.shape)}", f"device='{self.fake_device}'"]
        if self.dtype != torch.get_default_dtype():
            extras.append(f"dtype={self.dtype}")
        if self.requires_grad:
            extras.append("requires_grad=True")
        prefix = "Parameter containing:\n" if getattr(self, "_is_param", False) else ""
        return f"{prefix}tensor(..., {', '.join(extras)}, fake=True)"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__reduce_ex__:
            raise not_picklable(args[0])
        if func is torch.Tensor.data_ptr:
            from torchdefer.fake._storage_objects import data_ptr

            return data_ptr(args[0])
        if func in DATA_READS:
            raise FakeTensorError(
                f"{_name(func)} needs the data of a fake tensor, and fake tensors have "
                "none. Use torchdefer.deferred_init to record the value instead, or "
                "compute it from a real tensor."
            )
        from torchdefer.fake._calls import call_grad_safe
        from torchdefer.fake._mode import faking
        from torchdefer.fake._storage_objects import STORAGE_GETTERS, adopt

        with faking(), _compat.DisableTorchFunctionSubclass():
            out = call_grad_safe(func, args, kwargs)
        if func in STORAGE_GETTERS:
            return adopt(out, args[0], args[0].fake_device)
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.prim.device.default:
            return reported_device(args[0])
        decomposed = _compat.decomposed_in_inference(func, args, kwargs)  # reshape, ...
        if decomposed is not None:
            return decomposed
        out, device = run_on_meta(func, args, kwargs)
        return wrap_outputs(out, device, cls)


def not_picklable(t: FakeTensor) -> FakeTensorError:
    return FakeTensorError(
        f"Cannot save or pickle a fake tensor ({tuple(t.shape)} {t.dtype} on "
        f"{t.fake_device}): it has no data. Materialize it first "
        "(torchdefer.materialize_module(model) or materialize_tensor(t)), or save "
        "the code and arguments that build it."
    )


def reported_device(t: FakeTensor) -> torch.device:
    """What ``t.device`` answers: meta inside kernels, else the fake device.

    Inside a Python binding that takes a device guard before dispatching (see
    ``GUARDED``), a tensor on a device this host lacks reports the CPU, whose
    guard exists and does nothing; our dispatch takes devices from
    ``fake_device``, so outputs still land on the requested device.
    """
    if STATE.in_kernel:
        return _META
    if STATE.guarded and not device_available(t.fake_device):
        return _CPU
    return t.fake_device


def run_on_meta(
    func: Any, args: tuple, kwargs: dict, tensors: Sequence[torch.Tensor] | None = None
) -> tuple[Any, torch.device]:
    """Run ``func`` on the meta backend; returns (outputs, device of outputs).

    ``args`` may hold fake tensors (their impl is meta) and meta tensors; a
    ``device`` argument is redirected to meta and reported back. ``tensors``:
    the tensor arguments in order (``flat_tensors``), if the caller has them.
    """
    answer = _ANSWERS_BY_ID.get(id(func))  # OpOverload.__hash__ is Python: by id
    if answer is not None:
        return answer(*args, **kwargs), _CPU
    if tensors is None:
        tensors = list(flat_tensors(args, kwargs))
    if len(tensors) > 1 and first_conflict(tensors, device_of) is not None:
        from torchdefer.fake._cross_device import check_devices

        check_devices(func, args, kwargs, device_of)
    device = output_device(kwargs, tensors)
    if "device" in kwargs or (not tensors and _takes_device(func)):
        # A factory called as an OpOverload without `device` (torch.ops.aten.zeros.default([n]))
        # is eager's CPU call: on meta too, or its kernel would allocate it for real.
        kwargs = {**kwargs, "device": _META}
    device = normalize(device)
    if id(func) in _FULL_IDS and kwargs.get("dtype") is None:
        fill = args[1] if len(args) > 1 else kwargs["fill_value"]
        kwargs = {**kwargs, "dtype": _full_dtype(fill)}
    previous = _compat.meta_in_tls_dispatch_include()
    hint = _compat.meta_registrations.device_hint
    STATE.in_kernel = True
    _compat.set_meta_in_tls_dispatch_include(True)
    # Meta kernels whose output layout differs by device (svd, eig, conv with
    # channels_last, fft) ask device_hint(), which knows only PyTorch's own
    # FakeTensor and says "cuda" for anything else on meta.
    _compat.meta_registrations.device_hint = _device_hint
    # set_ onto a storage with the tensor's own sizes and no strides keeps its
    # strides on CPU and CUDA (resize_impl_ returns early); the meta kernel
    # makes them contiguous.
    kept = None
    if id(func) in _SET_IDS and device.type != "meta":
        kept = _kept_layout(args, kwargs)
    try:
        with _compat.DisableTorchDispatch():
            out = _META_STAND_INS.get(func, func)(*args, **kwargs)
            if device.type != "meta":  # on meta, the meta kernels' layouts are eager's
                out = eager_layout(func, args, kwargs, out, device)
            if kept is not None and tuple(out.shape) == kept[0] and out.stride() != kept[1]:
                out.as_strided_(kept[0], kept[1], out.storage_offset())
            if _compat.BCOMPLEX32 is not None:
                out = _eager_complex(out, args, kwargs)
    finally:
        _compat.meta_registrations.device_hint = hint
        STATE.in_kernel = False
        _compat.set_meta_in_tls_dispatch_include(previous)
    return out, device


# id(op) -> (op, whether its schema takes a `device` keyword); the op is kept
# so that its id stays its own.
_device_takers: dict[int, tuple[Any, bool]] = {}


def _takes_device(func: Any) -> bool:
    """Whether ``func`` (an op overload, or another callable) takes a ``device`` keyword."""
    known = _device_takers.get(id(func))
    if known is None:
        schema = getattr(func, "_schema", None)
        takes = schema is not None and any(
            a.name == "device" and a.kwarg_only for a in schema.arguments)
        known = _device_takers[id(func)] = (func, takes)
    return known[1]


# Factories whose meta call may go through torch's Python binding: the same
# aten overload, but an OpOverload call matches its arguments against the
# schema in C++ (~4 µs more a call), and a model makes one per parameter.
_FACTORY_BINDINGS: dict[int, Callable[..., torch.Tensor]] = {
    id(torch.ops.aten.empty.memory_format): torch.empty,
    id(torch.ops.aten.ones.default): torch.ones,
    id(torch.ops.aten.zeros.default): torch.zeros,
}
_FACTORY_KEYS = frozenset({"dtype", "device", "pin_memory"})


def factory_on_meta(func: Any, sizes: list[int], kwargs: dict) -> tuple[torch.Tensor, torch.device]:
    """``run_on_meta(func, (sizes,), kwargs)`` for ``empty``/``ones``/``zeros`` of plain sizes.

    Through the op's Python binding where the call has no keywords but
    ``dtype``, ``device`` and ``pin_memory=False`` (what a module's
    ``torch.empty(out, in, dtype=, device=)`` passes); any other call, through
    :func:`run_on_meta`. No Python code runs inside (no torch-function or
    dispatch modes, and these factories have no Python meta kernel), so the
    fake-kernel state ``run_on_meta`` sets for meta kernels is not needed.

    >>> out, device = factory_on_meta(torch.ops.aten.zeros.default, [2, 3],
    ...                               {"device": torch.device("cuda")})
    >>> out.device, out.shape, device.type
    (device(type='meta'), torch.Size([2, 3]), 'cuda')
    """
    binding = _FACTORY_BINDINGS.get(id(func))
    if (binding is None or not kwargs.keys() <= _FACTORY_KEYS
            or kwargs.get("pin_memory", False) is not False):
        return run_on_meta(func, (sizes,), kwargs)
    explicit = kwargs.get("device")
    device = _CPU if explicit is None else normalize(torch.device(explicit))  # output_device's rule
    with _compat.DisableTorchDispatch(), _compat.DisableTorchFunction():
        out = binding(sizes, dtype=kwargs.get("dtype"), device=_META)
    return out, device


# full.names exists only in some torch versions
_FULL = frozenset(getattr(torch.ops.aten.full, name) for name in torch.ops.aten.full.overloads()
                  if name in ("default", "names"))
# By id, for the lookups made on every op (these ops live as long as torch).
_FULL_IDS = frozenset(id(f) for f in _FULL)
_ANSWERS_BY_ID = {id(f): answer for f, answer in ANSWERS.items()}
# Ops whose meta kernel refuses what the CPU and CUDA kernels accept, and what
# gives the outputs' metadata in its place (what eager does refuse is refused
# at the call by ``recorder._refusals``, which asks the real kernel):
# - ``bool_tensor << 2`` is int64 in eager, "Expected input tensor to have an
#   integral dtype" on meta: the bitwise shifts promote as eager's;
# - ``torch.where`` with a uint8 condition (deprecated, accepted with a
#   warning): "expected predicate to be bool" on meta;
# - in-place ``nan_to_num_`` of a complex tensor: its meta decomposition asks
#   isneginf, which refuses complex.
_aten = torch.ops.aten


def _where_of_bool(where: Any) -> Callable[..., Any]:
    def stand_in(condition: torch.Tensor, *args: Any) -> Any:
        if condition.dtype == torch.uint8:
            condition = condition.to(torch.bool)
        return where(condition, *args)

    return stand_in


def _nan_to_num_(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if self.is_complex():
        return self  # in place: the metadata stays
    return _aten.nan_to_num_.default(self, *args, **kwargs)


_SET_IDS = frozenset(map(id, (_aten.set_.source_Storage, _aten.set_.source_Storage_storage_offset,
                               _aten.set_.source_Tensor_storage_offset)))


def _kept_layout(args: tuple, kwargs: dict) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``self``'s sizes and strides before a ``set_`` that gives no strides, else None."""
    stride = args[4] if len(args) > 4 else kwargs.get("stride")
    if stride:
        return None
    self = args[0]
    return tuple(self.shape), self.stride()


_META_STAND_INS: dict[Any, Callable[..., Any]] = {
    **{getattr(_aten.where, name): _where_of_bool(getattr(_aten.where, name))
       for name in ("self", "ScalarSelf", "ScalarOther", "Scalar")},
    _aten.nan_to_num_.default: _nan_to_num_,
    _aten.__lshift__.Scalar: _aten.bitwise_left_shift.Tensor_Scalar,
    _aten.__lshift__.Tensor: _aten.bitwise_left_shift.Tensor,
    _aten.__rshift__.Scalar: _aten.bitwise_right_shift.Tensor_Scalar,
    _aten.__rshift__.Tensor: _aten.bitwise_right_shift.Tensor,
    _aten.__ilshift__.Scalar: _aten.bitwise_left_shift_.Tensor_Scalar,
    _aten.__ilshift__.Tensor: _aten.bitwise_left_shift_.Tensor,
    _aten.__irshift__.Scalar: _aten.bitwise_right_shift_.Tensor_Scalar,
    _aten.__irshift__.Tensor: _aten.bitwise_right_shift_.Tensor,
}


def _full_dtype(fill: Any) -> torch.dtype:
    """The dtype eager's ``torch.full`` infers from ``fill`` (in C++: a complex
    fill gives complex64 under a float16 default dtype, the meta kernel's
    Python inference complex32), read off an empty eager call."""
    with _compat.DisableTorchDispatch():
        return torch.ops.aten.full.default([0], fill, device="cpu").dtype


def _eager_complex(out: Any, args: tuple, kwargs: dict) -> Any:
    """complex64 where a meta kernel made a bcomplex32 from the default dtype (see
    _compat); a bfloat16 or bcomplex32 input gives bcomplex32 in eager too."""
    if isinstance(out, torch.Tensor):
        if out.dtype != _compat.BCOMPLEX32 or kwargs.get("dtype") == _compat.BCOMPLEX32:
            return out
        if any(t.dtype in (torch.bfloat16, _compat.BCOMPLEX32)
               for t in flat_tensors(args, kwargs)):
            return out
        return out.to(torch.complex64)
    if isinstance(out, (tuple, list)):
        return type(out)(_eager_complex(o, args, kwargs) for o in out)
    return out


_original_device_hint = _compat.meta_registrations.device_hint


def _device_hint(tensor: Any) -> str:
    """``torch._meta_registrations.device_hint`` that also knows our fake tensors."""
    device = getattr(tensor, "fake_device", None)
    if device is not None and device.type != "meta":  # eager's meta tensors: the original's
        return device.type
    return _original_device_hint(tensor)


def wrap_outputs(out: Any, device: torch.device, cls: type[FakeTensor]) -> Any:
    """Turn the plain meta tensors among ``out`` into fake tensors on ``device``."""

    def wrap(o: Any) -> Any:
        if type(o) is torch.Tensor:
            return cls(o, device)
        return o

    return tree_map(wrap, out)


def _name(func: Any) -> str:
    return str(getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func)))


def is_fake(tensor: object) -> bool:
    """Whether ``tensor`` is a torchdefer fake tensor (deferred ones included).

    >>> import torch, torchdefer
    >>> with torchdefer.fake_mode():
    ...     x = torch.empty(2, device="cuda")
    >>> torchdefer.is_fake(x), x.device
    (True, device(type='cuda', index=0))
    """
    return isinstance(tensor, FakeTensor)


def flat_tensors(args: tuple, kwargs: dict):
    """The tensor arguments in order: positional, then keyword, one list level deep."""
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b
