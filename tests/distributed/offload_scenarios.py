"""FSDP2 with ``CPUOffloadPolicy`` on deferred models, on gloo ranks (see test_cpu_offload.py).

Each scenario is ``(rank, world_size) -> None`` and raises on any mismatch
with the eager model sharded the same way. ``fully_shard`` with CPU offload
copies each shard to the CPU and pins it (``pin_memory=True``, the default);
eager cannot pin on a host without an accelerator, so there the pinned
scenario checks that deferral fails where and as eager fails, and a third
scenario runs the pinned path on a simulated accelerator host.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

import torchdefer
import torchdefer.distributed as tdd
from torchdefer.distributed.shard import observe
from torchdefer.fake import _pinned
from torchdefer.fake._pinned import PinnedMemoryError

ALL = [
    "cpu_offload_without_pinning_matches_eager",
    "cpu_offload_with_pinning_fails_or_matches_as_eager",
    "cpu_offload_with_pinning_on_a_simulated_accelerator_host",
]


def _model() -> nn.Module:
    # 7 rows on 2 ranks: rank 1's padded shard has a row of padding
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3), nn.LayerNorm(3))


def _shard(model: nn.Module, policy: CPUOffloadPolicy) -> None:
    for layer in (model[0], model[2]):
        fully_shard(layer, offload_policy=policy)
    fully_shard(model, offload_policy=policy)


def _pairs(model: nn.Module):
    """(name, sharded parameter, FSDPParam) of every parameter."""
    from torchdefer.distributed._module import _fsdp2_params

    names = {id(p): n for n, p in model.named_parameters()}
    return sorted((names[id(f.sharded_param)], f.sharded_param, f) for f in _fsdp2_params(model))


def _check_shards(eager: nn.Module, model: nn.Module) -> None:
    """Every local shard and padded flat shard: eager's values, layout and pinning."""
    for (name, ref, ref_fsdp), (_, param, fsdp) in zip(_pairs(eager), _pairs(model)):
        local, ref_local = param.to_local(), ref.to_local()
        assert not torchdefer.is_fake(local), f"{name} is still deferred"
        assert torch.equal(local, ref_local), f"{name}: local shard differs from eager's"
        assert local.stride() == ref_local.stride(), name
        flat, ref_flat = fsdp._sharded_param_data, ref_fsdp._sharded_param_data
        assert torch.equal(flat, ref_flat), f"{name}: padded shard differs"
        assert flat.untyped_storage().data_ptr() == local.untyped_storage().data_ptr(), name
        assert local.is_pinned() == ref_local.is_pinned(), f"{name}: pinning differs"


def _step(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(1)
    x = torch.randn(4, 5)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    out = model(x)
    out.pow(2).mean().backward()
    optim.step()
    return out.detach(), {n: p.full_tensor() for n, p in model.named_parameters()}


def cpu_offload_without_pinning_matches_eager(rank: int, world: int) -> None:
    policy = CPUOffloadPolicy(pin_memory=False)
    torch.manual_seed(0)
    eager = _model()
    _shard(eager, policy)
    eager_rng = torch.get_rng_state()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_model)
    _shard(model, policy)
    assert torch.equal(torch.get_rng_state(), eager_rng), "the generator moved differently"
    assert not any(p.to_local().is_pinned() for p in model.parameters())
    torchdefer.materialize_module(model)  # hands sharded modules to torchdefer.distributed
    assert not torchdefer.is_deferred(model)
    _check_shards(eager, model)
    (out, stepped), (ref_out, ref_stepped) = _step(model), _step(eager)
    assert torch.equal(out, ref_out), "forward differs"
    for name, ref in ref_stepped.items():
        assert torch.equal(stepped[name], ref), f"{name} differs after a training step"


def cpu_offload_with_pinning_fails_or_matches_as_eager(rank: int, world: int) -> None:
    policy = CPUOffloadPolicy()  # pin_memory=True, the default
    torch.manual_seed(0)
    eager = _model()
    try:
        _shard(eager, policy)
        eager_error = None
    except RuntimeError as e:  # no accelerator: no pinned memory allocator
        eager_error = e
    eager_rng = torch.get_rng_state()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_model)
    if eager_error is None:
        _shard(model, policy)
        assert all(p.to_local().is_pinned() for p in model.parameters())
        tdd.materialize_module(model)
        _check_shards(eager, model)
        return
    try:
        _shard(model, policy)
    except PinnedMemoryError as e:
        assert isinstance(e, RuntimeError) and str(eager_error) in str(e), str(e)
        assert "CPUOffloadPolicy(pin_memory=False)" in str(e), str(e)
    else:
        raise AssertionError(f"eager failed ({eager_error}) but deferral did not")
    assert torch.equal(torch.get_rng_state(), eager_rng)
    # Both failed in the first fully_shard: the first layer's weight is not sharded.
    assert not isinstance(model[0].weight, DTensor) and not isinstance(eager[0].weight, DTensor)


def cpu_offload_with_pinning_on_a_simulated_accelerator_host(rank: int, world: int) -> None:
    """pin_memory=True where pinning works: shards report pinned while deferred, and
    materialization, torchdefer.load_state_dict and dcp.load pin each padded shard
    once; dcp.load's values make the init dead."""
    pinned: list[int] = []  # data_ptr of what pin() returned

    def pin(real):
        out = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype).copy_(real)
        pinned.append(out.untyped_storage().data_ptr())
        return out

    saved = _pinned.pinning_refusal, _pinned.pin
    _pinned.pinning_refusal, _pinned.pin = (lambda factory: None), pin
    try:
        torch.manual_seed(0)
        eager = _model()  # values as pinned: pinning copies them
        _shard(eager, CPUOffloadPolicy(pin_memory=False))
        path = Path(os.environ["TORCHDEFER_TEST_CHECKPOINTS"], f"offload-{world}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(eager.state_dict(), checkpoint_id=path)
        for how in ("materialize", "torchdefer.load_state_dict", "dcp.load"):
            torch.manual_seed(0)
            model = torchdefer.deferred_init(_model)
            _shard(model, CPUOffloadPolicy())
            for name, param, fsdp in _pairs(model):
                assert param.to_local().is_pinned(), name
                assert fsdp._sharded_param_data.untyped_storage().is_pinned(), name
            pinned.clear()
            with observe() as seen:
                if how == "torchdefer.load_state_dict":
                    state = {n: p.full_tensor() for n, p in eager.named_parameters()}
                    torchdefer.load_state_dict(model, state)
                elif how == "dcp.load":
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        dcp.load(model.state_dict(), checkpoint_id=path)
                    tdd.materialize_module(model)
                else:
                    tdd.materialize_module(model)
            locals_ = sorted(p.to_local().untyped_storage().data_ptr() for p in model.parameters())
            assert sorted(pinned) == locals_, f"each padded shard must be pinned, once ({how})"
            for (name, ref, _), (_, param, _) in zip(_pairs(eager), _pairs(model)):
                assert torch.equal(param.to_local(), ref.to_local()), f"{name} ({how})"
            if how == "dcp.load":  # what the load overwrites is not drawn (padding aside)
                sizes = {n: p.to_local().numel() for n, p in model.named_parameters()}
                assert not [s for s in seen if s.drawn and s.numel == sizes[s.name]], seen
    finally:
        _pinned.pinning_refusal, _pinned.pin = saved
