"""Build a thing eagerly and deferred from the same seed; compare everything."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import torchdefer


def build_both(fn: Callable[..., Any], *args: Any, seed: int = 0, **kwargs: Any):
    """(eager, deferred) results of ``fn``, each built right after ``manual_seed(seed)``."""
    torch.manual_seed(seed)
    eager = fn(*args, **kwargs)
    torch.manual_seed(seed)
    deferred = torchdefer.deferred_init(fn, *args, **kwargs)
    return eager, deferred


def assert_same_tensor(real: torch.Tensor, ref: torch.Tensor, name: str = "") -> None:
    assert not torchdefer.is_fake(real), f"{name} is still fake"
    assert real.dtype == ref.dtype, f"{name}: dtype {real.dtype} != {ref.dtype}"
    assert real.shape == ref.shape, f"{name}: shape {real.shape} != {ref.shape}"
    assert real.device == ref.device, f"{name}: device {real.device} != {ref.device}"
    assert real.requires_grad == ref.requires_grad, f"{name}: requires_grad differs"
    assert isinstance(real, nn.Parameter) == isinstance(ref, nn.Parameter), (
        f"{name}: Parameter-ness differs"
    )
    assert real.stride() == ref.stride(), f"{name}: stride {real.stride()} != {ref.stride()}"
    assert torch.equal(real, ref), f"{name}: values differ"


def assert_same_module(real: nn.Module, ref: nn.Module) -> None:
    """Values, dtype, device, requires_grad, Parameter-ness, tying and shared storage."""
    assert not torchdefer.is_deferred(real)
    real_state = dict(real.named_parameters(remove_duplicate=False))
    real_state.update(real.named_buffers(remove_duplicate=False))
    ref_state = dict(ref.named_parameters(remove_duplicate=False))
    ref_state.update(ref.named_buffers(remove_duplicate=False))
    assert real_state.keys() == ref_state.keys()
    for name, ref_t in ref_state.items():
        assert_same_tensor(real_state[name], ref_t, name)
    names = list(ref_state)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            same_object = ref_state[a] is ref_state[b]
            assert (real_state[a] is real_state[b]) == same_object, f"tying of {a}, {b}"
            ref_shared = _same_storage(ref_state[a], ref_state[b])
            assert _same_storage(real_state[a], real_state[b]) == ref_shared, (
                f"storage sharing of {a}, {b}"
            )


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and (
        a.untyped_storage().nbytes() > 0
    )


def check_module_parity(fn: Callable[..., nn.Module], *args: Any, **kwargs: Any) -> nn.Module:
    eager, deferred = build_both(fn, *args, **kwargs)
    assert torchdefer.is_deferred(deferred)
    torchdefer.materialize_module(deferred)
    assert_same_module(deferred, eager)
    return deferred
