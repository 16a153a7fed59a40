"""deferred_init inside deferred_init, materialization inside it, and fake_mode around it."""

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module, assert_same_tensor, build_both
from torchdefer.fake import FakeTensorError
from torchdefer.recorder import RecordingError


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)


class Outer(nn.Module):
    def __init__(self, nested):
        super().__init__()
        self.inner = torchdefer.deferred_init(Inner) if nested else Inner()
        self.other = nn.Linear(3, 3)
        with torch.no_grad():
            self.other.weight.copy_(self.inner.lin.weight * 2)


def test_a_nested_deferred_init_records_into_the_outer_one_and_matches_eager():
    torch.manual_seed(0)
    eager = Outer(nested=False)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(Outer, nested=True)
    assert deferred.inner.lin.weight._graph is deferred.other.weight._graph
    torchdefer.materialize_module(deferred)
    assert_same_module(deferred, eager)


def test_materialize_tensor_inside_deferred_init_gives_the_value_so_far():
    def build(materialize):
        w = torch.randn(3)
        r = torchdefer.materialize_tensor(w) if materialize else w.clone()
        return w * 2, r + 1

    eager, _ = build_both(build, False)
    _, deferred = build_both(build, True)
    for ref, t in zip(eager, deferred, strict=True):
        assert_same_tensor(torchdefer.materialize_tensor(t), ref)


def test_writing_after_materialize_tensor_inside_deferred_init_says_what_to_do():
    def build():
        w = torch.randn(3)
        torchdefer.materialize_tensor(w)
        w.add_(1)

    with pytest.raises(RecordingError, match=r"add_.*test_nesting.py:\d+.*already materialized.*after deferred_init returns"):
        torchdefer.deferred_init(build)


def test_deferred_init_inside_fake_mode_says_why_and_what_to_do():
    with torchdefer.fake_mode(), pytest.raises(RecordingError, match=r"entered inside FakeMode.*Leave that mode first"):
        torchdefer.deferred_init(nn.Linear, 2, 2)


def test_data_dependent_ops_in_fake_mode_say_to_use_deferred_init():
    with torchdefer.fake_mode():
        x = torch.ones(3, device="cuda")
        with pytest.raises(FakeTensorError, match=r"nonzero.*needs the data.*deferred_init"):
            torch.nonzero(x)
