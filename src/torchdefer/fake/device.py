"""Which device an op's outputs live on, and whether a device can be faked.

The rules follow the fake-tensor design note (seed 001): an explicit ``device``
argument wins, else the devices of the tensor arguments, else the CPU. Among
tensor arguments a 0-dim CPU tensor yields to a tensor on an accelerator, as in
eager PyTorch (``cuda_tensor * torch.tensor(2.)`` lives on CUDA).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["device_available", "output_device"]

_CPU = torch.device("cpu")


def output_device(kwargs: dict, tensors: Iterable[torch.Tensor]) -> torch.device:
    """The device eager PyTorch would give the outputs of a call."""
    explicit = kwargs.get("device")
    if explicit is not None:
        return normalize(torch.device(explicit))
    first: torch.device | None = None
    for t in tensors:
        # fake_device, not .device: inside a guarded binding a fake tensor may
        # report "cpu" (see fake.tensor.reported_device).
        dev = getattr(t, "fake_device", None) or t.device
        if first is None:
            first = dev
        if dev.type not in ("cpu", "meta"):
            return dev
    return first if first is not None else _CPU


def normalize(device: torch.device) -> torch.device:
    """``cuda`` -> ``cuda:<current>``, as eager tensors report it."""
    if device.index is None and device.type == "cuda":
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return torch.device("cuda", index)
    return device


def device_available(device: torch.device) -> bool:
    """Whether real tensors can be allocated on ``device`` in this process."""
    if device.type in ("cpu", "meta"):
        return True
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()
    module = getattr(torch, device.type, None)
    is_available = getattr(module, "is_available", None)
    return bool(is_available()) if callable(is_available) else False
