"""Tensors kept as plain module attributes are materialized too, and is_deferred sees them."""

import dataclasses
import functools
import logging
import types
import warnings

import torch
from torch import nn

import torchdefer
from parity import assert_same_module, assert_same_tensor, build_both


class Rotary(nn.Module):
    """A rotary table kept as a plain attribute (as some models do), plus caches."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4))
        self.pos_freqs = [torch.outer(torch.arange(3).float(), self.inv_freq)]
        self.tables = {"cos": self.pos_freqs[0].cos(), "pair": (torch.randn(2), torch.ones(1))}
        self.seen = {torch.zeros(1)}  # a set of tensors
        self.weight_alias = self.proj.weight  # a parameter also held as an attribute
        self.row = self.proj.weight[0]  # a view of a parameter
        self.helpers = [nn.Linear(2, 2)]  # a module kept unregistered, in a list


def _attributes(m: Rotary):
    return {
        "inv_freq": m.inv_freq,
        "pos_freqs[0]": m.pos_freqs[0],
        "tables['cos']": m.tables["cos"],
        "tables['pair'][0]": m.tables["pair"][0],
        "tables['pair'][1]": m.tables["pair"][1],
        "seen": next(iter(m.seen)),
        "row": m.row,
        "helpers[0].weight": m.helpers[0].weight,
        "helpers[0].bias": m.helpers[0].bias,
    }


def test_plain_tensor_attributes_and_containers_materialize_like_eager():
    eager, deferred = build_both(Rotary)
    torchdefer.materialize_module(deferred)
    assert_same_module(deferred, eager)
    reference = _attributes(eager)
    for name, real in _attributes(deferred).items():
        assert_same_tensor(real, reference[name], name)
    assert deferred.weight_alias is deferred.proj.weight


def test_view_attribute_shares_storage_with_its_parameter_after_materialization():
    _, deferred = build_both(Rotary)
    torchdefer.materialize_module(deferred)
    assert deferred.row.untyped_storage().data_ptr() == deferred.proj.weight.untyped_storage().data_ptr()


def test_is_deferred_is_true_while_an_attribute_is_deferred():
    _, deferred = build_both(Rotary)
    torchdefer.materialize_module(deferred.proj)
    deferred.helpers[0] = nn.Linear(2, 2)  # real
    assert torchdefer.is_deferred(deferred)  # inv_freq, caches
    torchdefer.materialize_module(deferred)
    assert not torchdefer.is_deferred(deferred)


def test_is_deferred_sees_a_deferred_tensor_in_a_nested_container():
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.cache = {"layers": [(torch.zeros(1), torch.randn(2))]}

    deferred = torchdefer.deferred_init(Holder)
    assert torchdefer.is_deferred(deferred)
    torchdefer.materialize_module(deferred)
    assert not torchdefer.is_deferred(deferred)
    assert not torchdefer.is_fake(deferred.cache["layers"][0][1])


def test_legacy_weight_norm_weight_attribute_is_real_and_forward_matches_eager():
    def build():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return nn.utils.weight_norm(nn.Linear(3, 4))

    eager, deferred = build_both(build)
    assert "weight" not in dict(deferred.named_parameters())
    assert torchdefer.is_deferred(deferred)
    torchdefer.materialize_module(deferred)
    assert not torchdefer.is_deferred(deferred)
    assert_same_module(deferred, eager)
    assert not torchdefer.is_fake(deferred.weight) and torch.equal(deferred.weight, eager.weight)
    x = torch.randn(2, 3)
    assert torch.equal(deferred(x), eager(x))


def test_buffers_only_materializes_attributes_and_leaves_parameters_deferred():
    _, deferred = build_both(Rotary)
    torchdefer.materialize_module(deferred, buffers_only=True)
    assert not torchdefer.is_fake(deferred.inv_freq)
    assert torchdefer.is_fake(deferred.proj.weight) and deferred.weight_alias is deferred.proj.weight


def test_check_fn_skips_the_attributes_of_modules_it_rejects():
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Rotary()
            self.scale = torch.ones(2)

    _, deferred = build_both(Outer)
    torchdefer.materialize_module(deferred, check_fn=lambda m: isinstance(m, Outer))
    assert not torchdefer.is_fake(deferred.scale)
    assert torchdefer.is_fake(deferred.inner.inv_freq)


class RotaryCache:
    """A cache that is a plain class, not a module (as some codebases write it)."""

    def __init__(self, dim: int) -> None:
        self.cos = torch.randn(3, dim)
        self.sin = self.cos.sin()
        self.owner_name = "attn"


@dataclasses.dataclass(slots=True)
class Tables:
    scale: torch.Tensor
    table: dict


class WithObjects(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.rotary = RotaryCache(4)
        self.tables = Tables(torch.rand(2), {"bias": torch.randn(3)})
        self.ns = types.SimpleNamespace(offset=torch.arange(3.0) * 0.5, inner=RotaryCache(2))
        self.mix = functools.partial(torch.add, torch.randn(2), alpha=torch.ones(()))
        self.log = logging.getLogger("torchdefer-test")  # not looked into


def _object_attributes(m: WithObjects):
    return {
        "rotary.cos": m.rotary.cos,
        "rotary.sin": m.rotary.sin,
        "tables.scale": m.tables.scale,
        "tables.table['bias']": m.tables.table["bias"],
        "ns.offset": m.ns.offset,
        "ns.inner.cos": m.ns.inner.cos,
        "mix.args[0]": m.mix.args[0],
        "mix.keywords['alpha']": m.mix.keywords["alpha"],
    }


def test_tensors_held_by_plain_objects_slots_and_partials_materialize_like_eager():
    eager, deferred = build_both(WithObjects)
    assert torchdefer.is_deferred(deferred)
    torchdefer.materialize_module(deferred.proj)
    assert torchdefer.is_deferred(deferred)  # the objects' tensors are still deferred
    torchdefer.materialize_module(deferred)
    assert not torchdefer.is_deferred(deferred)
    reference = _object_attributes(eager)
    for name, real in _object_attributes(deferred).items():
        assert_same_tensor(real, reference[name], name)


def test_reached_tensors_names_paths_into_objects_and_visits_a_shared_object_once():
    from torchdefer.recorder._reach import reached_tensors

    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            cache = RotaryCache(2)
            self.a = nn.Module()
            self.b = nn.Module()
            self.a.cache = cache
            self.b.cache = cache

    deferred = torchdefer.deferred_init(Shared)
    paths = sorted(r.path for r in reached_tensors(deferred))
    assert paths == ["a.cache.cos", "a.cache.sin"]
    torchdefer.materialize_module(deferred)
    assert not torchdefer.is_fake(deferred.b.cache.cos)
