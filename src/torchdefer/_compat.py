"""The one place for private or version-sensitive PyTorch APIs.

torchdefer supports every torch from the floor in ``pyproject.toml`` to the
newest release (docs/VERSIONS.md has what each gave). Code elsewhere calls
the helpers here instead of reaching into ``torch._*`` or branching on the
torch version, so a torch upgrade that moves or fixes something is one edit
in this file. Each shim detects the feature, not the version number, and says
which releases need it, so it can be dropped when the floor passes them.

Not everything private lives here yet: the uses that needed no shim are still
at their call sites, to be moved in one step.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = [
    "default_device_context",
    "hash_tensor",
    "restore_default_device",
    "serialize_exported_program",
]


def default_device_context() -> Any:
    """The ``DeviceContext`` that ``torch.set_default_device`` installed, or None.

    Not ``torch.get_default_device()``: that builds a tensor, which fails under
    ``with torch.device("cuda")`` on a host without CUDA.
    """
    return getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)


def restore_default_device(context: Any) -> None:
    """Put back the default device that :func:`default_device_context` returned.

    torch 2.8 stores the None that ``set_default_device(None)`` leaves and then
    crashes in ``get_default_device()`` (and in all later code that asks it)
    reading ``None.device`` (2.10 reads it safely). With no context at all
    every version answers "cpu", so the stored None is dropped everywhere.
    """
    torch.set_default_device(None if context is None else context.device)
    if context is None and hasattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context"):
        del torch._GLOBAL_DEVICE_CONTEXT.device_context


def serialize_exported_program(ep: torch.export.ExportedProgram) -> Any:
    """``torch._export.serde.serialize(ep)`` without the weights, where torch allows.

    The ``serialize_state_dict``/``serialize_constants``/``serialize_example_inputs``
    keywords arrived in torch 2.12 (2.10 lacks them); before, the weights are
    pickled into the artifact too, and callers that store their own weights
    ignore those fields.
    """
    from torch._export.serde import serialize as serde

    keywords = inspect.signature(serde.serialize).parameters
    if "serialize_state_dict" not in keywords:
        return serde.serialize(ep)
    return serde.serialize(
        ep,
        serialize_state_dict=False,
        serialize_constants=False,
        serialize_example_inputs=False,
    )


def hash_tensor(t: torch.Tensor) -> torch.Tensor:
    """``torch.hash_tensor(t)``: the xor of ``t``'s elements widened to 64 bits.

    torch 2.8 has no torch.hash_tensor (2.10 has it); there the same xor is
    folded here: a 0-dim int64 tensor with the bits of torch's uint64 result.
    """
    if hasattr(torch, "hash_tensor"):
        return torch.hash_tensor(t)
    return _xor_fold(t)


def _xor_fold(t: torch.Tensor) -> torch.Tensor:
    wide = torch.float64 if t.is_floating_point() else torch.int64
    flat = t.reshape(-1).to(wide).view(torch.int64)
    if flat.numel() == 0:
        return torch.zeros((), dtype=torch.int64)
    while flat.numel() > 1:  # halve: log2(n) vector xors instead of a Python loop
        if flat.numel() % 2:
            flat = torch.cat([flat, flat.new_zeros(1)])
        half = flat.numel() // 2
        flat = flat[:half] ^ flat[half:]
    return flat[0]
