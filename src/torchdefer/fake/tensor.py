"""FakeTensor: a tensor that reports a real device but has only meta storage.

Following PyTorch's own ``torch._subclasses.fake_tensor``, the tensor's own
TensorImpl *is* a meta tensor (the "shadow" of seed 001), created with
``_make_subclass(..., dispatch_device=True)`` so that ``.device`` is answered in
Python with the device the code asked for. Kernels run on the meta backend; the
tensor allocates no storage. Owning the impl (rather than wrapping a separate
meta tensor) is what lets in-place metadata ops such as ``q.t_()`` in
``nn.init.orthogonal_`` change the very object the user holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch.utils._pytree import tree_map

from torchdefer.fake.device import device_available

__all__ = ["FakeTensor", "FakeTensorError", "is_fake", "run_on_meta"]


class FakeTensorError(RuntimeError):
    """A fake tensor was asked for something it does not have (its data)."""


# Per-thread flag: while a meta kernel runs, fake tensors must say "meta" so
# that kernels pick the meta implementation; everywhere else they report their
# fake device.
_kernel = threading.local()

_META = torch.device("meta")
_CPU = torch.device("cpu")

# Python bindings that take a device guard for their tensor argument before
# dispatching (python_variable_methods.cpp, python_variable_indexing.cpp). A
# CPU-only build has no CUDA guard: PyTorch's own FakeTensorMode fails there.
GUARDED: frozenset[Callable[..., Any]] = frozenset(
    {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.contiguous}
)

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

    # Attributes the subclass keeps in ``__dict__``; ``swap_tensors`` moves them.
    _meta_attrs: ClassVar[tuple[str, ...]] = ("fake_device",)

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device) -> FakeTensor:
        if elem.device.type != "meta":
            raise TypeError(f"FakeTensor needs a meta tensor, got one on {elem.device}")
        out = torch.Tensor._make_subclass(
            cls,
            elem,
            elem.requires_grad,
            dispatch_device=True,
            device_for_backend_keys=device,
        )
        out.fake_device = device
        return out

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        extras = [f"size={tuple(self.shape)}", f"device='{self.fake_device}'"]
        if self.dtype != torch.get_default_dtype():
            extras.append(f"dtype={self.dtype}")
        if self.requires_grad:
            extras.append("requires_grad=True")
        prefix = "Parameter containing:\n" if getattr(self, "_is_param", False) else ""
        return f"{prefix}tensor(..., {', '.join(extras)}, fake=True)"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func in DATA_READS:
            raise FakeTensorError(
                f"{_name(func)} needs the data of a fake tensor, and fake tensors have "
                "none. Use torchdefer.deferred_init to record the value instead, or "
                "compute it from a real tensor."
            )
        from torchdefer.fake.mode import faking

        with faking(), torch._C.DisableTorchFunctionSubclass():
            return call_grad_safe(func, args, kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func is torch.ops.prim.device.default:
            return reported_device(args[0])
        out, device = run_on_meta(func, args, kwargs)
        return wrap_outputs(out, device, cls)


def in_kernel() -> bool:
    return getattr(_kernel, "active", False)


def reported_device(t: FakeTensor) -> torch.device:
    """What ``t.device`` answers: meta inside kernels, else the fake device.

    Inside a Python binding that takes a device guard before dispatching (see
    ``GUARDED``), a tensor on a device this host lacks reports the CPU, whose
    guard exists and does nothing; our dispatch takes devices from
    ``fake_device``, so outputs still land on the requested device.
    """
    if in_kernel():
        return _META
    if getattr(_kernel, "guarded", False) and not device_available(t.fake_device):
        return _CPU
    return t.fake_device


def run_on_meta(func: Any, args: tuple, kwargs: dict) -> tuple[Any, torch.device]:
    """Run ``func`` on the meta backend; returns (outputs, device of outputs).

    ``args`` may hold fake tensors (their impl is meta) and meta tensors; a
    ``device`` argument is redirected to meta and reported back.
    """
    from torchdefer.fake.device import normalize, output_device

    tensors = [a for a in _flat_tensors(args, kwargs)]
    device = output_device(kwargs, tensors)
    if "device" in kwargs:
        kwargs = {**kwargs, "device": torch.device("meta")}
    device = normalize(device)
    previous = torch._C._meta_in_tls_dispatch_include()
    _kernel.active = True
    torch._C._set_meta_in_tls_dispatch_include(True)
    try:
        with torch._C._DisableTorchDispatch():
            out = func(*args, **kwargs)
    finally:
        _kernel.active = False
        torch._C._set_meta_in_tls_dispatch_include(previous)
    return out, device


def wrap_outputs(out: Any, device: torch.device, cls: type[FakeTensor]) -> Any:
    """Turn the plain meta tensors among ``out`` into fake tensors on ``device``."""

    def wrap(o: Any) -> Any:
        if type(o) is torch.Tensor:
            return cls(o, device)
        return o

    return tree_map(wrap, out)


def call_grad_safe(func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Call ``func``; if autograd would touch a fake device this process lacks, don't.

    Autograd asks the device's guard for a stream when it builds a graph node,
    and a CPU-only build has no CUDA guard (the process aborts). Such calls run
    under ``no_grad`` and the outputs get the ``requires_grad`` eager would give.
    """
    # The Python bindings of copy_ and to() take a device guard before they
    # dispatch, and a CPU-only build has no CUDA guard (PyTorch's own
    # FakeTensorMode fails the same way); the ops themselves take none on the
    # way to our dispatch, so call them directly.
    if func is torch.Tensor.copy_:
        func = _copy_
    elif func is torch.Tensor.to or func is torch.Tensor.cuda:
        rerouted = _to_missing_device(func, args, kwargs)
        if rerouted is not None:
            func, args, kwargs = rerouted
    elif func is torch.Tensor.new_tensor and not device_available(args[0].fake_device):
        func, args, kwargs = _new_tensor, args, kwargs
    elif func in GUARDED and not getattr(_kernel, "guarded", False):
        _kernel.guarded = True
        try:
            return call_grad_safe(func, args, kwargs)
        finally:
            _kernel.guarded = False
    if torch.is_grad_enabled():
        needs_grad = False
        missing_device = False
        for t in _flat_tensors(args, kwargs):
            if t.requires_grad:
                needs_grad = True
            if isinstance(t, FakeTensor) and not device_available(t.fake_device):
                missing_device = True
        if needs_grad and missing_device:
            with torch.no_grad():
                out = func(*args, **kwargs)

            def mark(o: Any) -> Any:
                if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()):
                    if not o.requires_grad and o._base is None:
                        o.requires_grad_(True)
                return o

            return tree_map(mark, out)
    return func(*args, **kwargs)


def _new_tensor(self: torch.Tensor, data: Any, dtype=None, device=None, requires_grad=False, **kw):
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


def _to_missing_device(func, args: tuple, kwargs: dict):
    """``t.to(...)``/``t.cuda()`` from or to a device this host lacks, as ``_to_copy``."""
    from torchdefer.fake.device import normalize

    self, rest = args[0], args[1:]
    kwargs = dict(kwargs)
    if func is torch.Tensor.cuda:
        index = rest[0] if rest else kwargs.pop("device", None)
        device: Any = torch.device("cuda", index) if isinstance(index, int) else index or "cuda"
        rest, kwargs = (device,), {"non_blocking": kwargs.get("non_blocking", False)}
    copy = bool(kwargs.pop("copy", False))
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*rest, **kwargs)
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


def _flat_tensors(args: tuple, kwargs: dict):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b
    for a in kwargs.values():
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b


def _name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))


def is_fake(tensor: object) -> bool:
    """Whether ``tensor`` is a torchdefer fake tensor (deferred ones included).

    >>> import torch, torchdefer
    >>> with torchdefer.fake_mode():
    ...     x = torch.empty(2, device="cuda")
    >>> torchdefer.is_fake(x), x.device
    (True, device(type='cuda', index=0))
    """
    return isinstance(tensor, FakeTensor)
