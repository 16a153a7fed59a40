"""Keys a module's own load logic supplies: torchdefer.load_state_dict accepts what eager accepts."""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module
from torchdefer.checkpoint import CheckpointKeyError


def _build() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.InstanceNorm1d(4, track_running_stats=True))


def _without_counters(metadata_version: int | None):
    torch.manual_seed(1)
    trained = _build()
    with torch.no_grad():  # as training moves the running stats
        for norm in (trained[1], trained[2]):
            norm.running_mean.add_(0.5)
            norm.running_var.mul_(2.0)
    state = trained.state_dict()
    kept = collections.OrderedDict(
        (k, v) for k, v in state.items() if not k.endswith("num_batches_tracked"))
    if metadata_version is not None:
        kept._metadata = collections.OrderedDict(  # type: ignore[attr-defined]
            (k, {**v, "version": metadata_version}) for k, v in state._metadata.items())
    return kept


@pytest.mark.parametrize(("form", "metadata_version"), [
    ("dict", None), ("dict", 1), ("torch.save", None), ("torch.save", 1),
    ("safetensors", None),  # a safetensors file keeps no _metadata
])
def test_old_norm_checkpoint_without_counters_loads_strictly_as_eager(tmp_path, form, metadata_version):
    state = _without_counters(metadata_version)
    torch.manual_seed(0)
    eager = _build()
    eager.load_state_dict(state, strict=True)
    source: object = state
    if form == "torch.save":
        source = tmp_path / "model.pt"
        torch.save(state, source)
    elif form == "safetensors":
        from safetensors.torch import save_file

        source = tmp_path / "model.safetensors"
        save_file(dict(state), source)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_build)
    torchdefer.load_state_dict(model, source, strict=True)
    assert_same_module(model, eager)


def test_current_norm_checkpoint_without_counters_is_refused_strictly_as_eager():
    state = _without_counters(2)
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="num_batches_tracked"):
        _build().load_state_dict(state, strict=True)
    model = torchdefer.deferred_init(_build)
    with pytest.raises(CheckpointKeyError, match="'1.num_batches_tracked'"):
        torchdefer.load_state_dict(model, state, strict=True)
    assert torchdefer.is_deferred(model)


def test_a_norm_held_under_two_names_keeps_its_counter_under_both_as_eager():
    def build() -> nn.Module:
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        model.add_module("again", model[1])  # eager's load visits it under each name
        return model

    torch.manual_seed(1)
    state = {k: v for k, v in build().state_dict().items() if "num_batches" not in k}
    torch.manual_seed(0)
    eager = build()
    eager.load_state_dict(state, strict=True)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(build)
    torchdefer.load_state_dict(model, state, strict=True)
    assert_same_module(model, eager)
