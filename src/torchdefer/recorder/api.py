"""deferred_init: run a constructor with every tensor fake and every op recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from torchdefer.recorder.errors import RecordingError
from torchdefer.recorder.graph import Graph
from torchdefer.recorder.mode import RecordingMode
from torchdefer.recorder.source import user_frame

__all__ = ["deferred_init"]

T = TypeVar("T")


def deferred_init(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` with every tensor it creates fake and recorded.

    Nothing is allocated for parameters, buffers or intermediates, whatever
    device the code asks for (``cuda`` works on a host without a GPU). Ops done
    on the returned tensors later are recorded too; called inside another
    ``deferred_init``, it records into that one. Materialize the result
    with :func:`torchdefer.materialize_module` or
    :func:`torchdefer.materialize_tensor`.

    Args:
        fn: a module class or any callable that builds tensors.
        *args, **kwargs: passed to ``fn``.

    Returns:
        Whatever ``fn`` returns, its tensors deferred.

    >>> import torch, torchdefer
    >>> m = torchdefer.deferred_init(torch.nn.Linear, 8192, 8192, device="cuda")
    >>> m.weight
    Parameter containing:
    tensor(..., size=(8192, 8192), device='cuda:0', requires_grad=True, fake=True)
    """
    active = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if isinstance(active, RecordingMode):
        # Nested (a constructor that calls deferred_init itself): the inner
        # call records into the outer graph, so its tensors are the outer
        # recording's, exactly as eager code would build them.
        return fn(*args, **kwargs)
    if active is not None:
        raise RecordingError(
            f"deferred_init({_name(fn)}) was called while {type(active).__name__} is active "
            f"(at {_caller()}); both need PyTorch's single fake-mode slot. Call it outside "
            "torchdefer.fake_mode() / FakeTensorMode."
        )
    graph = Graph()
    dtype = torch.get_default_dtype()
    # Not torch.get_default_device(): it builds a tensor, which fails under
    # `with torch.device("cuda")` on a host without CUDA.
    device_context = _default_device_context()
    try:
        with RecordingMode(graph):
            return fn(*args, **kwargs)
    finally:
        # The constructor may change defaults and fail before restoring them.
        if torch.get_default_dtype() != dtype:
            torch.set_default_dtype(dtype)
        if _default_device_context() is not device_context:
            torch.set_default_device(None if device_context is None else device_context.device)


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _caller() -> str:
    frame = user_frame(3)
    return "<unknown location>" if frame is None else f"{frame[0]}:{frame[1]} in {frame[2]}"


def _default_device_context() -> Any:
    return getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
