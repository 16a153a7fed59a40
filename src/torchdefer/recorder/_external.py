"""A real tensor from outside a recording, referenced and checked for changes.

An external tensor is not copied (a pretrained embedding handed to a
constructor may be large); replay uses it as it stands then. So replay must
know that it still holds what recording saw. The version counter alone misses
writes that do not bump it: through ``t.data`` (a new counter), into the numpy
array behind ``torch.from_numpy``, or ``torch.utils.swap_tensors``, which gives
the object other contents. :class:`ExternalRef` keeps the version, the
storage and layout, and a digest of the bytes the tensor covers, and
:meth:`ExternalRef.changed` says what differs.

Hashing costs one pass over the tensor's bytes when it is first used and once
per replay that needs it, and no memory.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from torchdefer import _compat

__all__ = ["ExternalRef"]

_CHUNK = 64 * 2**20  # bytes copied to the host at a time for non-CPU tensors


@dataclass(frozen=True, slots=True)
class ExternalRef:
    tensor: torch.Tensor
    version: int
    storage: int  # the storage's address: swap_tensors changes it
    layout: tuple  # size, stride, offset, dtype, device
    digest: bytes

    @staticmethod
    def of(tensor: torch.Tensor) -> ExternalRef:
        return ExternalRef(
            tensor, _version(tensor), _storage(tensor), _layout(tensor), _digest(tensor)
        )

    def changed(self) -> str | None:
        """What changed since recording, or None."""
        t = self.tensor
        version = _version(t)
        if version != self.version:
            return f"modified in place (version {self.version} then, {version} now)"
        if _storage(t) != self.storage or _layout(t) != self.layout:
            return "given other contents (torch.utils.swap_tensors, set_, or .data = ...)"
        if _digest(t) != self.digest:
            return (
                "changed without a version bump (a write through t.data, or into the "
                "numpy array behind torch.from_numpy)"
            )
        return None


def _version(t: torch.Tensor) -> int:
    """``t._version``; -1 for an inference tensor, which keeps no version counter
    (a write to it shows in its digest only)."""
    return -1 if t.is_inference() else t._version


def _storage(t: torch.Tensor) -> int:
    try:
        return _compat.storage_id(t)
    except RuntimeError:  # a wrapper subclass without storage (DTensor)
        return -1


def _layout(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device)


def _digest(t: torch.Tensor) -> bytes:
    """A hash of the bytes ``t`` covers in its storage (from its first to its last element)."""
    if t.device.type == "meta" or t.numel() == 0 or _storage(t) == -1:
        return b""
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
    start, nbytes = t.storage_offset() * t.element_size(), extent * t.element_size()
    with torch.no_grad():
        raw = torch.empty(0, dtype=torch.uint8, device=t.device)
        try:
            raw.set_(t.untyped_storage(), start, (nbytes,), (1,))
        except (RuntimeError, NotImplementedError):  # no data of its own (a subclass)
            return b""
        h = hashlib.blake2b(digest_size=16)
        if raw.device.type == "cpu":
            h.update(raw.numpy().data)
        else:
            for i in range(0, nbytes, _CHUNK):
                h.update(raw[i : i + _CHUNK].cpu().numpy().data)
    return h.digest()
