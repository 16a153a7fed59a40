"""``dtype=`` at materialization: each tensor converted as soon as it is real.

``materialize_module(m, dtype=torch.bfloat16)`` gives what
``materialize_module(m); m.to(torch.bfloat16)`` gives, bit for bit, but never
holds the model in its recorded dtype: each tensor is replayed in its recorded
dtype, converted, swapped in, and the recorded-dtype copy is dropped before
the next one is replayed. Peak memory: the model in the target dtype plus one
tensor in its recorded dtype.
"""

from __future__ import annotations

import torch

from torchdefer.errors import UsageTypeError

__all__ = ["cast", "check_dtype"]


def check_dtype(dtype: torch.dtype | None) -> None:
    """Refuse what ``nn.Module.to`` refuses: a target dtype that is not floating or complex."""
    if dtype is None:
        return
    if not isinstance(dtype, torch.dtype):
        raise UsageTypeError(f"dtype= must be a torch.dtype such as torch.bfloat16, got {dtype!r}.")
    if not (dtype.is_floating_point or dtype.is_complex):
        raise UsageTypeError(
            f"dtype={dtype} is not a floating point or complex dtype; like Module.to(dtype), "
            "materialization converts only floating point and complex tensors, and only "
            "to such a dtype. Convert integer tensors yourself after materializing."
        )


def cast(real: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``real`` in ``dtype`` if it is floating point or complex, the rule of ``Module.to(dtype)``.

    Integer and bool tensors (``num_batches_tracked``, position ids) keep
    their dtype.
    """
    if dtype is None or real.dtype == dtype:
        return real
    if not (real.is_floating_point() or real.is_complex()):
        return real
    with torch.no_grad():
        out = real.detach().to(dtype)
    if isinstance(real, torch.nn.Parameter):
        return torch.nn.Parameter(out, requires_grad=real.requires_grad)
    return out.requires_grad_(real.requires_grad)
