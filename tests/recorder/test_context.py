"""with torchdefer.deferred(): the context-manager form of deferred_init."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module
from torchdefer.recorder import Graph, RecordingError


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))


def test_the_block_builds_what_deferred_init_builds():
    torch.manual_seed(0)
    eager = _model()
    torch.manual_seed(0)
    with torchdefer.deferred() as graph:
        model = _model()
    assert isinstance(graph, Graph)
    assert torchdefer.is_deferred(model)
    torchdefer.materialize_module(model)
    assert_same_module(model, eager)


def test_global_state_is_left_as_found_when_the_block_raises():
    dtype = torch.get_default_dtype()
    with pytest.raises(ValueError, match="boom"):
        with torchdefer.deferred():
            torch.set_default_dtype(torch.float64)
            torch.set_default_device("cuda")
            raise ValueError("boom")
    assert torch.get_default_dtype() == dtype
    assert torch.empty(1).device.type == "cpu"
    assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None
    assert not torchdefer.is_fake(torch.empty(1))


def test_blocks_and_deferred_init_nest_into_one_graph():
    torch.manual_seed(0)
    eager_a, eager_b = torch.randn(3), nn.Linear(3, 3)
    torch.manual_seed(0)
    with torchdefer.deferred() as outer:
        a = torch.randn(3)
        with torchdefer.deferred() as inner:
            b = torchdefer.deferred_init(nn.Linear, 3, 3)
        c = a + b.weight[0]  # tensors from both levels combine
    assert inner is outer
    assert a._graph is b.weight._graph is c._graph
    assert torch.equal(torchdefer.materialize_tensor(a), eager_a)
    torchdefer.materialize_module(b)
    assert torch.equal(b.weight, eager_b.weight)


def test_entering_inside_fake_mode_says_which_mode_is_in_the_way():
    with torchdefer.fake_mode():
        with pytest.raises(RecordingError, match="FakeMode"):
            with torchdefer.deferred():
                pass
