"""A tie broken after recording (torch's load_state_dict(assign=True)) is said at materialization."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.recorder._ties import BrokenTieWarning


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def _checkpoint_storing_the_tie_once() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return {"embed.weight": Tied().embed.weight.detach().clone()}


def test_assign_load_of_a_tied_checkpoint_warns_at_materialization_naming_the_tie():
    sd = _checkpoint_storing_the_tie_once()
    torch.manual_seed(0)
    eager = Tied()
    eager.load_state_dict(sd, assign=True, strict=False)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(Tied)
    model.load_state_dict(sd, assign=True, strict=False)
    with pytest.warns(BrokenTieWarning, match=r"'head.weight' was tied to 'embed.weight'.*tie_weights") as seen:
        torchdefer.materialize_module(model)
    assert seen[0].filename == __file__  # points at the user's materialize call
    # The values are eager's: torch's assign unties in eager code too.
    assert torch.equal(model.head.weight, eager.head.weight)
    assert torch.equal(model.embed.weight, eager.embed.weight)


@pytest.mark.parametrize("load", ["none", "torchdefer", "copy"])
def test_no_tie_warning_when_the_tie_holds(load):
    torch.manual_seed(0)
    model = torchdefer.deferred_init(Tied)
    if load == "torchdefer":
        torchdefer.load_state_dict(model, _checkpoint_storing_the_tie_once())
    elif load == "copy":
        torchdefer.materialize_module(model)
        model.load_state_dict(_checkpoint_storing_the_tie_once(), strict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BrokenTieWarning)
        torchdefer.materialize_module(model)
    assert model.head.weight is model.embed.weight


def test_a_tie_undone_while_recording_is_no_broken_tie():
    def build() -> Tied:
        m = Tied()
        m.head.weight = nn.Parameter(torch.randn(10, 4))  # the user's own untie
        return m

    torch.manual_seed(0)
    model = torchdefer.deferred_init(build)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BrokenTieWarning)
        torchdefer.materialize_module(model)
