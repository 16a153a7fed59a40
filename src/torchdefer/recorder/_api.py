"""deferred_init: run a constructor with every tensor fake and every op recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from torchdefer.recorder._context import deferred

__all__ = ["deferred_init"]

T = TypeVar("T")
P = ParamSpec("P")


def deferred_init(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Call ``fn(*args, **kwargs)`` with every tensor it creates fake and recorded.

    Nothing is allocated for parameters, buffers or intermediates, whatever
    device the code asks for (``cuda`` works on a host without a GPU). Ops done
    on the returned tensors later are recorded too. Materialize the result
    with :func:`torchdefer.materialize_module` or
    :func:`torchdefer.materialize_tensor`.

    The same as ``with torchdefer.deferred(): fn(*args, **kwargs)``; called
    inside such a block (or another ``deferred_init``), it records into the
    outer graph.

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
    with deferred():
        return fn(*args, **kwargs)
