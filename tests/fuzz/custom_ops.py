"""Random custom ops for the fuzzer (issue 9, class 11): one tagged, one not.

Both draw from the global generator inside their kernel. The tagged one says
so (``nondeterministic_seeded``); the untagged one is what third-party kernels
often are, and replaying it on the live generator would give values eager
code never saw: torchdefer must record it as random or refuse it.
"""

import torch

__all__ = ["noise_tagged", "noise_untagged"]


@torch.library.custom_op("torchdefer_fuzz::noise_tagged", mutates_args=(),
                         tags=(torch.Tag.nondeterministic_seeded,))
def noise_tagged(x: torch.Tensor) -> torch.Tensor:
    return x + torch.randn_like(x)


@torch.library.custom_op("torchdefer_fuzz::noise_untagged", mutates_args=())
def noise_untagged(x: torch.Tensor) -> torch.Tensor:
    return x + torch.rand_like(x)


@noise_tagged.register_fake
def _(x):
    return torch.empty_like(x)


@noise_untagged.register_fake
def _(x):
    return torch.empty_like(x)
