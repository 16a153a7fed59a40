"""Code written for torchdistX: the names it used, and its positional buffers_only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.fake import meta_like


def test_meta_like_mirrors_a_fake_tensor_on_the_meta_device():
    model = torchdefer.deferred_init(nn.Linear, 4, 2, device="cuda")
    meta = meta_like(model.weight.t())
    expected = torch.empty(2, 4, device="meta").t()
    assert meta.is_meta and meta.shape == expected.shape and meta.stride() == expected.stride()
    assert meta.requires_grad and not torchdefer.is_fake(meta)


def test_meta_like_refuses_a_real_tensor_as_torchdistx_did():
    with pytest.raises(ValueError, match="expects a fake tensor"):
        meta_like(torch.ones(2))


def test_torchdistx_style_positional_buffers_only_is_refused_with_the_keyword_to_use():
    model = torchdefer.deferred_init(nn.BatchNorm1d, 3)
    with pytest.raises(TypeError, match="buffers_only=True"):
        torchdefer.materialize_module(model, True)
    torchdefer.materialize_module(model, buffers_only=True)
    assert torchdefer.is_deferred(model.weight) and not torchdefer.is_deferred(model.running_mean)


def test_to_empty_on_a_deferred_model_is_recorded_and_stays_deferred():
    model = torchdefer.deferred_init(nn.Linear, 4, 2)
    model.to_empty(device="cpu")
    assert torchdefer.is_deferred(model)
    torchdefer.materialize_module(model)  # uninitialized memory, as to_empty gives eagerly
    assert model.weight.shape == (2, 4) and not torchdefer.is_fake(model.weight)
