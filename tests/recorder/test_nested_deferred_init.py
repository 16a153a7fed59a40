"""deferred_init inside deferred_init, and inside another fake mode."""

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module
from torchdefer.recorder import RecordingError


def test_nested_deferred_init_records_into_the_outer_call_and_matches_eager():
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(
        lambda: nn.Sequential(torchdefer.deferred_init(nn.Linear, 3, 4), nn.Linear(4, 2)))
    torchdefer.materialize_module(lazy)
    assert_same_module(lazy, eager)


def test_nested_deferred_init_restores_the_default_dtype_it_found():
    def inner():
        torch.set_default_dtype(torch.float64)
        return torch.ones(2)

    def outer():
        a = torchdefer.deferred_init(inner)
        return a, torch.ones(2)

    a, b = torchdefer.deferred_init(outer)
    assert (a.dtype, b.dtype) == (torch.float64, torch.float32)
    assert torch.get_default_dtype() == torch.float32


def test_deferred_init_inside_fake_mode_is_refused_with_what_to_do():
    with torchdefer.fake_mode():
        with pytest.raises(RecordingError, match=r"inside FakeMode.*Leave that mode first"):
            torchdefer.deferred_init(nn.Linear, 2, 2)
