"""meta_like: the meta tensor a fake tensor mirrors (torchdistX's ``fake.meta_like``)."""

from __future__ import annotations

import torch

from torchdefer import _compat
from torchdefer.errors import UsageError
from torchdefer.fake._layout import meta_twin
from torchdefer.fake._tensor import FakeTensor

__all__ = ["meta_like"]


def meta_like(fake: torch.Tensor) -> torch.Tensor:
    """A meta tensor with ``fake``'s shape, strides, dtype and ``requires_grad``.

    The drop-in for torchdistX's ``torchdistx.fake.meta_like``: code that hands
    a fake tensor's layout to meta-device tooling keeps working. The result
    shares nothing with ``fake`` (later ops on it are not recorded).

    Args:
        fake: a fake (or deferred) tensor.

    Raises:
        UsageError: (a ``ValueError``, as torchdistX raised) ``fake`` is not a fake tensor.

    >>> import torch, torchdefer
    >>> from torchdefer.fake import meta_like
    >>> m = torchdefer.deferred_init(torch.nn.Linear, 4, 2, device="cuda")
    >>> meta_like(m.weight)
    tensor(..., device='meta', size=(2, 4), requires_grad=True)
    """
    if not isinstance(fake, FakeTensor):
        raise UsageError(
            f"meta_like expects a fake tensor (from torchdefer.fake_mode or deferred_init), "
            f"got a real {type(fake).__name__} on {fake.device}; use "
            "torch.empty_like(t, device='meta') for real tensors."
        )
    with _compat.DisableTorchFunctionSubclass():
        out = meta_twin(fake)
    return out.requires_grad_(fake.requires_grad)
