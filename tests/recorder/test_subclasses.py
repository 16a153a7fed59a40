"""Deferred parameters behave as nn.Parameter, and Parameter subclasses keep their class."""

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module, build_both
from torchdefer.recorder import RecordingError


class Int8Params(nn.Parameter):
    """Like bitsandbytes' Int8Params: its own __new__ with extra arguments and attributes."""

    def __new__(cls, data=None, requires_grad=True, has_fp16_weights=False, CB=None, SCB=None):
        if data is None:
            data = torch.empty(0)
        obj = torch.Tensor._make_subclass(cls, data, requires_grad)
        obj.CB, obj.SCB, obj.has_fp16_weights = CB, SCB, has_fp16_weights
        return obj


class ScaledParam(nn.Parameter):
    """A subclass without its own __new__; attributes set afterwards."""


def _quantized_linear():
    m = nn.Linear(4, 3)
    m.weight = Int8Params(m.weight.data, requires_grad=False, has_fp16_weights=True)
    m.bias = ScaledParam(m.bias.data)
    m.bias.scale = 0.5
    return m


def test_deferred_parameter_is_an_nn_parameter():
    m = torchdefer.deferred_init(nn.Linear, 3, 2)
    assert isinstance(m.weight, nn.Parameter) and torchdefer.is_deferred(m.weight)
    assert isinstance(m.weight.detach(), torch.Tensor)
    assert not isinstance(m.weight.detach(), nn.Parameter)  # as in eager


def test_type_of_a_deferred_parameter_builds_parameters_like_nn_parameter():
    m = torchdefer.deferred_init(nn.Linear, 3, 2)
    deferred = type(m.weight)(m.weight.data * 2, requires_grad=False)
    assert isinstance(deferred, nn.Parameter) and torchdefer.is_deferred(deferred)
    assert not deferred.requires_grad
    real = type(m.weight)(torch.ones(2), requires_grad=False)
    assert type(real) is nn.Parameter and not torchdefer.is_fake(real)


def test_nn_parameter_of_a_deferred_parameter_is_a_new_parameter_sharing_storage():
    eager, deferred = build_both(lambda: nn.Linear(3, 2))
    again = nn.Parameter(deferred.weight)
    assert again is not deferred.weight and isinstance(again, nn.Parameter)
    real = torchdefer.materialize_tensor(again)
    assert type(real) is nn.Parameter and torch.equal(real, eager.weight)
    assert real.untyped_storage().data_ptr() == torchdefer.materialize_tensor(
        deferred.weight).untyped_storage().data_ptr()


def test_parameter_subclasses_keep_their_class_and_attributes_after_materialization():
    eager, deferred = build_both(_quantized_linear)
    assert isinstance(deferred.weight, Int8Params) and isinstance(deferred.bias, ScaledParam)
    torchdefer.materialize_module(deferred)
    assert type(deferred.weight) is Int8Params and type(deferred.bias) is ScaledParam
    assert deferred.weight.has_fp16_weights is True and deferred.weight.CB is None
    assert deferred.bias.scale == 0.5
    assert_same_module(deferred, eager)
    assert not deferred.weight.requires_grad


def test_materialize_tensor_of_a_parameter_subclass_keeps_class_and_attributes():
    eager, deferred = build_both(_quantized_linear)
    real = torchdefer.materialize_tensor(deferred.weight)
    assert type(real) is Int8Params and real.has_fp16_weights is True
    assert torch.equal(real, eager.weight)


def test_type_of_a_deferred_parameter_subclass_calls_its_new_with_its_arguments():
    _, deferred = build_both(_quantized_linear)
    weight = deferred.weight
    again = type(weight)(weight.data, requires_grad=False, has_fp16_weights=False, CB="cb")
    assert isinstance(again, Int8Params) and torchdefer.is_deferred(again)
    assert again.CB == "cb" and again.has_fp16_weights is False
    real = type(weight)(torch.ones(2), requires_grad=False, CB="cb")
    assert type(real) is Int8Params and real.CB == "cb"


def test_a_tensor_subclass_with_its_own_dispatch_cannot_wrap_deferred_data():
    class Wrapper(torch.Tensor):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with pytest.raises(RecordingError, match=r"Wrapper.*own __torch_dispatch__.*after materialization"):
        torchdefer.deferred_init(lambda: torch.Tensor._make_subclass(Wrapper, torch.ones(2)))


def test_make_subclass_is_restored_after_deferred_init():
    torchdefer.deferred_init(_quantized_linear)
    assert "_make_subclass" not in torch.Tensor.__dict__
    with pytest.raises(ValueError):
        torchdefer.deferred_init(lambda: (_quantized_linear(), (_ for _ in ()).throw(ValueError)))
    assert "_make_subclass" not in torch.Tensor.__dict__
