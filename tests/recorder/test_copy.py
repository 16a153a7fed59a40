"""copy.deepcopy and copy.copy of deferred modules and tensors, as eager does them."""

import copy

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module, build_both


class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        flat = torch.randn(10)
        self.register_buffer("head", flat[:4])
        self.register_buffer("tail", flat[4:])
        self.register_buffer("flat", flat)
        self.embed = nn.Embedding(5, 3)
        self.out = nn.Linear(3, 5, bias=False)
        self.out.weight = self.embed.weight  # tied
        self.extra = nn.Parameter(torch.randn(2))
        self.extra.tag = "kept"


def test_deepcopy_of_a_deferred_module_matches_deepcopy_of_eager():
    eager, deferred = build_both(Shared)
    eager_copy, deferred_copy = copy.deepcopy(eager), copy.deepcopy(deferred)
    assert torchdefer.is_deferred(deferred_copy)
    assert deferred_copy.out.weight is deferred_copy.embed.weight
    assert deferred_copy.embed.weight is not deferred.embed.weight
    torchdefer.materialize_module(deferred_copy)
    assert_same_module(deferred_copy, eager_copy)  # tying and shared storage included
    assert hasattr(deferred_copy.extra, "tag") == hasattr(eager_copy.extra, "tag")


def test_deepcopy_leaves_the_original_deferred_and_correct():
    eager, deferred = build_both(Shared)
    copy.deepcopy(deferred)
    torchdefer.materialize_module(deferred)
    assert_same_module(deferred, eager)


def test_deepcopy_of_an_in_place_modified_copy_does_not_touch_the_original():
    eager, deferred = build_both(Shared)
    deferred_copy = copy.deepcopy(deferred)
    with torch.no_grad():
        deferred_copy.flat.mul_(2)
    torchdefer.materialize_module(deferred)
    torchdefer.materialize_module(deferred_copy)
    assert_same_module(deferred, eager)
    assert torch.equal(deferred_copy.head, eager.head * 2)  # the copy's views share its storage


def test_shallow_copy_of_a_deferred_module_shares_its_tensors():
    eager, deferred = build_both(Shared)
    shallow = copy.copy(deferred)
    assert shallow.embed is deferred.embed
    torchdefer.materialize_module(shallow)
    assert not torchdefer.is_deferred(deferred)
    assert_same_module(deferred, eager)


def test_copy_of_a_deferred_parameter_aliases_it_with_its_attributes():
    _, deferred = build_both(Shared)
    alias = copy.copy(deferred.extra)
    assert isinstance(alias, nn.Parameter) and alias is not deferred.extra and alias.tag == "kept"
    real = torchdefer.materialize_tensor(alias)
    assert real.untyped_storage().data_ptr() == torchdefer.materialize_tensor(
        deferred.extra).untyped_storage().data_ptr()


def test_deepcopy_of_a_non_leaf_tensor_is_refused_as_in_eager():
    x = torchdefer.deferred_init(lambda: torch.randn(3, requires_grad=True) * 2)
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(x)
