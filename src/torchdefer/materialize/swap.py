"""Putting real tensors into modules so that every existing reference sees them."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["swap_in"]


def swap_in(
    fake: torch.Tensor, real: torch.Tensor, slots: list[tuple[nn.Module, str, str]]
) -> None:
    """Make ``fake`` real everywhere it is referenced.

    ``torch.utils.swap_tensors`` turns the fake object itself into the real
    tensor, so tied attributes, ``nn.LSTM._flat_weights`` and an optimizer
    built earlier all see it. When PyTorch refuses the swap (a view or weakref
    still holds the fake tensor), every module slot in ``slots`` is reassigned
    instead; modules that mirror their parameters (LSTM) do so in
    ``__setattr__``.
    """
    if isinstance(fake, nn.Parameter):
        shell: torch.Tensor = nn.Parameter(real, requires_grad=fake.requires_grad)
    else:
        shell = real.detach().requires_grad_(fake.requires_grad)
    try:
        torch.utils.swap_tensors(fake, shell)
    except (RuntimeError, TypeError):
        for module, kind, name in slots:
            if kind == "_parameters":
                module._parameters[name] = shell  # type: ignore[assignment]
            else:
                module._buffers[name] = shell
            if isinstance(module, nn.RNNBase) and name in module._flat_weights_names:
                module._flat_weights[module._flat_weights_names.index(name)] = shell
