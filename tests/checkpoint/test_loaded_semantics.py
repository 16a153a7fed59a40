"""What a loaded model is: eager's layout, own storages, no non-persistent buffers, NaN ties.

Each case is compared with eager construction followed by
``Module.load_state_dict`` of the same checkpoint.
"""

from __future__ import annotations

import pytest
import torch
from _crafted import deferred, eager, mlp, trained_state
from torch import nn

import torchdefer
from parity import assert_same_module


class WithRotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("inv_freq", torch.arange(4.0), persistent=False)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def _eager_loaded(build, state, strict=False):
    model = eager(build)
    model.load_state_dict(state, strict=strict)
    return model


def test_non_persistent_buffers_are_not_loaded_as_module_load_state_dict_does_not():
    state = dict(trained_state(WithRotary), inv_freq=torch.full((4,), 9.0))
    model = deferred(WithRotary)
    with pytest.warns(UserWarning, match="'inv_freq'"):
        result = torchdefer.load_state_dict(model, state)
    assert result.unexpected_keys == ("inv_freq",)
    assert_same_module(model, _eager_loaded(WithRotary, state))
    assert torch.equal(model.inv_freq, torch.arange(4.0))


@pytest.mark.parametrize("stored", ["transposed", "broadcast", "view-of-larger"])
def test_stored_strides_become_eager_layout_and_an_optimizer_steps(tmp_path, stored):
    state = trained_state()
    if stored == "transposed":
        state["0.weight"] = state["0.weight"].t().contiguous().t()
    elif stored == "broadcast":
        state["0.bias"] = torch.full((1,), 0.5).expand(8)
    else:
        state["0.bias"] = torch.cat([state["0.bias"], torch.zeros(100)])[:8]
    torch.save(state, tmp_path / "model.pt")
    model = deferred()
    torchdefer.load_state_dict(model, tmp_path / "model.pt", strict=True)
    reference = _eager_loaded(mlp, state, strict=True)
    assert_same_module(model, reference)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert p.stride() == q.stride(), name
        assert p.untyped_storage().nbytes() == q.untyped_storage().nbytes(), name
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 6)).sum().backward()
    optimizer.step()


@pytest.mark.parametrize("via", ["state dict", "torch.save"])
def test_one_tensor_stored_under_two_untied_names_gets_a_storage_per_name(tmp_path, via):
    build = lambda: nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))  # noqa: E731
    state = trained_state(build)
    state["1.weight"] = state["0.weight"]
    source = state
    if via == "torch.save":
        torch.save(state, tmp_path / "model.pt")
        source = tmp_path / "model.pt"
        loaded = torch.load(source, weights_only=True)
        assert loaded["0.weight"].data_ptr() == loaded["1.weight"].data_ptr()  # shared in the file
    model = deferred(build)
    torchdefer.load_state_dict(model, source, strict=True)
    assert_same_module(model, _eager_loaded(build, state, strict=True))
    assert model[0].weight.untyped_storage().data_ptr() != model[1].weight.untyped_storage().data_ptr()
    with torch.no_grad():
        model[0].weight.add_(1)
    assert not torch.equal(model[0].weight, model[1].weight)


def test_tied_names_holding_the_same_nans_are_accepted():
    state = trained_state(Tied)
    weight = state["embed.weight"].clone()
    weight[0, 0] = float("nan")
    state = {"embed.weight": weight, "head.weight": weight.clone()}
    model = deferred(Tied)
    torchdefer.load_state_dict(model, state, strict=True)
    assert model.head.weight is model.embed.weight
    assert torch.equal(model.embed.weight.isnan(), weight.isnan())


def test_tied_names_with_different_nans_or_signed_zeros_are_refused():
    state = trained_state(Tied)
    other = state["embed.weight"].clone()
    other[0, 0] = -other[0, 0]
    with pytest.raises(torchdefer.checkpoint.CheckpointMismatchError, match="tied"):
        torchdefer.load_state_dict(deferred(Tied),
                                   {"embed.weight": state["embed.weight"], "head.weight": other})


def test_a_deferred_or_meta_tensor_in_a_state_dict_is_refused():
    meta = {k: v.to("meta") for k, v in trained_state().items()}
    with pytest.raises(torchdefer.checkpoint.CheckpointMismatchError, match="no data"):
        torchdefer.load_state_dict(deferred(), meta)
    other = deferred(seed=1)
    with pytest.raises(torchdefer.checkpoint.CheckpointMismatchError, match="deferred"):
        torchdefer.load_state_dict(deferred(), other.state_dict())


@pytest.mark.parametrize("stored", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("final", [torch.bfloat16, torch.float16])
def test_a_half_checkpoint_with_dtype_matches_loading_then_module_to(stored, final):
    state = {k: v.to(stored) if v.is_floating_point() else v
             for k, v in trained_state().items()}
    model = deferred()
    torchdefer.load_state_dict(model, state, dtype=final, strict=True)
    assert_same_module(model, _eager_loaded(mlp, state, strict=True).to(final))
