"""Pinned host memory on fake tensors: what eager answers, refuses and makes.

Pinned (page-locked) memory is a property of a CPU storage: eager's
``is_pinned`` asks the accelerator's allocator whether the storage's pointer
is its own, so every view of a pinned tensor is pinned, a copy is not, and a
tensor on any other device never is (``aten/src/ATen/native/Memory.cpp``).
FSDP2's ``CPUOffloadPolicy`` pins each parameter's shard that way.

* ``t.pin_memory()`` is composite: ``is_pinned``, then ``_pin_memory`` if not.
  ``_pin_memory`` refuses a tensor off the CPU ("cannot pin ... only dense
  CPU tensors can be pinned"), then takes the accelerator's pinned allocator,
  which a host without an accelerator does not have: a CPU-only host raises
  "Cannot access accelerator device when none is available". Its output is a
  new CPU tensor with the input's sizes and strides at offset 0.
* ``pin_memory=True`` on a factory asks the allocator the same way ("pin_memory=True
  requires a CUDA or other accelerator backend ...").

The allocator check is eager's own: an empty real tensor is pinned at the
call (:func:`pinning_refusal`), so a fake tensor is refused exactly where and
as eager is, whatever the host's accelerator. Where pinning works, a deferred
tensor's recorded storage carries the flag (``recorder`` sets it, also for
``torch.tensor(data, pin_memory=True)``, which pins a real tensor before
lifting it: :func:`lifted_is_pinned`) and replay pins (:func:`pin`).
``fake_mode`` records nothing and cannot carry the flag, so it refuses every
pinning call (``t.pin_memory()``, ``pin_memory=True`` on a factory or a
``*_like``, a pinned tensor lifted: :func:`refuse_in_fake_mode`) rather than
answer ``is_pinned`` wrongly later; where eager refuses, with eager's error.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from torchdefer.errors import PinnedMemoryError
from torchdefer.fake._outside import no_fake_modes
from torchdefer.fake._source import user_frame

__all__ = ["PinnedMemoryError", "is_pinned", "lifted_is_pinned", "pin", "pin_memory_output",
           "pinning_refusal", "refuse_in_fake_mode", "storage_is_pinned"]


def pinning_refusal(factory: bool) -> RuntimeError | None:
    """What eager raises when it pins memory on this host (None: it pins).

    ``factory``: ``pin_memory=True`` on a factory, whose message differs from
    ``t.pin_memory()``'s. Asked of eager with an empty tensor, outside any mode.
    """
    with no_fake_modes():
        try:
            if factory:  # on the CPU whatever the user's default device
                torch.empty(0, device="cpu", pin_memory=True)
            else:
                torch.empty(0, device="cpu").pin_memory()
        except RuntimeError as e:
            return e
    return None


def check_pinning(what: str, device: torch.device, factory: bool) -> None:
    """Raise what eager raises for pinning a tensor on ``device`` here, if it does."""
    if device.type != "cpu":
        raise PinnedMemoryError(
            f"{what} at {_where()}: only dense CPU tensors can be pinned, and this tensor is "
            f"on '{device}'; eager PyTorch raises a RuntimeError here too. Pin a CPU copy "
            "(t.cpu().pin_memory()), as FSDP2's CPUOffloadPolicy does."
        )
    refusal = pinning_refusal(factory)
    if refusal is not None:
        raise PinnedMemoryError(
            f"{what} at {_where()}: eager PyTorch cannot pin memory on this host either "
            f"(RuntimeError: {refusal}): pinned memory comes from an accelerator's "
            "allocator, and this process has no accelerator. Run on a host with CUDA, or "
            "do without pinning (FSDP2: CPUOffloadPolicy(pin_memory=False); DataLoader: "
            "pin_memory=False)."
        ) from refusal


def pin_memory_output(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    """``aten._pin_memory`` on a fake tensor: eager's checks, then an empty output of
    its sizes and strides at offset 0 (on meta: the caller wraps it as a CPU tensor)."""
    fake_device = getattr(self, "fake_device", self.device)
    check_pinning("t.pin_memory()", fake_device, factory=False)
    if getattr(self, "_value", None) is None:  # fake_mode: no storage record to flag
        raise _fake_mode_refusal("t.pin_memory()")
    from torchdefer import _compat

    with _compat.DisableTorchDispatch():
        return torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device="meta")


def refuse_in_fake_mode(func: Any, device: torch.device) -> None:
    """``pin_memory=True`` on a factory under ``fake_mode``: eager's error where eager
    refuses (this host, a tensor off the CPU), else the refusal of a mode that records
    nothing. Never an unpinned fake that eager would have pinned."""
    what = f"{func}(pin_memory=True)"
    check_pinning(what, device, factory=True)
    raise _fake_mode_refusal(what)


def lifted_is_pinned(real: torch.Tensor) -> bool:
    """Whether a real tensor torch lifts into a mode (``torch.tensor(data,
    pin_memory=True)`` pins it first, outside any mode) is pinned."""
    return real.device.type == "cpu" and real.layout == torch.strided and real.is_pinned()


def _fake_mode_refusal(what: str) -> PinnedMemoryError:
    return PinnedMemoryError(
        f"{what} at {_where(3)} under torchdefer.fake_mode, which records nothing, so "
        "the fake tensor could not say it is pinned (is_pinned() would answer False "
        "where eager answers True). Pin under torchdefer.deferred_init, which records "
        "it and pins at materialization, or after materialization."
    )


def is_pinned(self: torch.Tensor, device: Any = None) -> bool:
    """``Tensor.is_pinned()`` as eager answers it: the recorded storage's flag, for CPU
    tensors only."""
    if device is not None:
        warnings.warn("The argument 'device' of Tensor.is_pinned() is deprecated. Please do "
                      "not pass this argument.", DeprecationWarning, stacklevel=3)
    if getattr(self, "fake_device", self.device).type != "cpu":
        return False
    value = getattr(self, "_value", None)
    return bool(value is not None and value.storage.pinned)


def storage_is_pinned(storage: Any, owner: torch.Tensor | None) -> bool:
    """``storage.is_pinned()`` for a fake storage: its owner tensor's answer."""
    return owner is not None and is_pinned(owner)


def pin(real: torch.Tensor) -> torch.Tensor:
    """Pinned memory with ``real``'s values, sizes and strides (replay's ``_pin_memory``).

    A tensor a replay put on another device than the CPU (``device=``) cannot be
    pinned: it is copied there as eager's ``_pin_memory`` would copy.
    """
    if real.device.type != "cpu":
        out = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device=real.device)
        return out.copy_(real)
    return torch.ops.aten._pin_memory.default(real)


def _where(depth: int = 2) -> str:
    frame = user_frame(depth)
    return "<unknown location>" if frame is None else str(frame)
