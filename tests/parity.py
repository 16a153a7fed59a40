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


def eager(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The ``defer`` of :func:`check_program` that builds eagerly."""
    return fn(*args, **kwargs)


def check_program(program: Callable[[Callable[..., Any]], Any], order: list[int] | None = None):
    """Run ``program(defer)`` eagerly and deferred from seed 0; compare everything.

    Every tensor it returns (also inside lists, tuples and modules) is
    materialized (in ``order`` of the flattened outputs if given) and must
    equal eager's; every generator it returns, and the default CPU one, must
    end where eager leaves them.
    """
    torch.manual_seed(0)
    ref = list(_flat(program(eager)))
    ref_state = torch.get_rng_state()
    torch.manual_seed(0)
    got = list(_flat(program(torchdefer.deferred_init)))
    assert torch.equal(torch.get_rng_state(), ref_state), "the default CPU generator ended elsewhere"
    assert len(got) == len(ref)
    for i in order or range(len(ref)):
        r, g = ref[i], got[i]
        if isinstance(r, torch.Generator):
            assert torch.equal(g.get_state(), r.get_state()), f"generator {i} ended elsewhere"
        else:
            assert_same_tensor(torchdefer.materialize_tensor(g), r, f"output {i}")


def _flat(x: Any):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _flat(y)
    elif isinstance(x, nn.Module):
        yield from (t for _, t in sorted(x.state_dict(keep_vars=True).items()))
    else:
        yield x


def trunc_normal_reads_data() -> bool:
    """Whether this torch's ``nn.init.trunc_normal_`` is a rejection loop (torch >= 2.12).

    Before, it is erfinv of a uniform: elementwise, recorded op by op, and a
    shard can be made from its own rows.
    """
    from torchdefer.recorder._composite import _reads_data

    return _reads_data(torch.nn.init, "_no_grad_trunc_normal_")
