"""Which device an op's outputs live on, and whether a device can be faked.

The rule: an explicit ``device``
argument wins, else the devices of the tensor arguments, else the CPU. Among
tensor arguments a 0-dim CPU tensor yields to a tensor on an accelerator, as in
eager PyTorch (``cuda_tensor * torch.tensor(2.)`` lives on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

__all__ = ["device_available", "device_of", "first_conflict", "missing_device", "output_device"]

_CPU = torch.device("cpu")


def device_of(t: torch.Tensor) -> torch.device:
    """The device a tensor stands for: ``fake_device`` for a fake one, not
    ``.device``, which inside a kernel or a guarded binding reports meta or cpu
    (see ``fake._tensor.reported_device``)."""
    return getattr(t, "fake_device", None) or t.device


def first_conflict(
    tensors: Iterable[torch.Tensor], device_of: Callable[[torch.Tensor], torch.device]
) -> tuple[int, torch.device, torch.device] | None:
    """The first tensor on another device than the first one (meta aside):
    ``(its index, the first device, its device)``, or None."""
    common = None
    for i, t in enumerate(tensors):
        device = device_of(t)
        if device.type == "meta":
            continue
        if common is None:
            common = device
        elif device != common:
            return i, common, device
    return None


def output_device(kwargs: dict, tensors: Iterable[torch.Tensor]) -> torch.device:
    """The device eager PyTorch would give the outputs of a call."""
    explicit = kwargs.get("device")
    if explicit is not None:
        return normalize(torch.device(explicit))
    first: torch.device | None = None
    for t in tensors:
        dev = device_of(t)
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


def missing_device(recorded: torch.device, place: torch.device, asked: bool, to_be: str) -> str:
    """How an error names a device this process lacks: the recorded one, or (``asked``:
    the caller's ``device=`` differs from it) the one asked for, ``to_be`` done there
    (``"loaded onto"``, ``"materialized on"``)."""
    if not asked:
        return f"was recorded on '{place}'"
    return f"was recorded on '{recorded}' and is to be {to_be} '{place}' (device=)"


def device_available(device: torch.device) -> bool:
    """Whether real tensors can be allocated on ``device`` in this process."""
    if device.type in ("cpu", "meta"):
        return True
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()
    module = getattr(torch, device.type, None)
    is_available = getattr(module, "is_available", None)
    return bool(is_available()) if callable(is_available) else False
