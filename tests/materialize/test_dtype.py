"""materialize_module(..., dtype=) and recorded conversions against eager Module.to(dtype)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module, assert_same_tensor, build_both


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Embedding(5, 4))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_dtype_at_materialization_matches_eager_then_to(dtype):
    eager, model = build_both(_model)
    torchdefer.materialize_module(model, dtype=dtype)
    assert_same_module(model, eager.to(dtype))


def test_integer_buffers_keep_their_dtype():
    _, model = build_both(_model)
    torchdefer.materialize_module(model, dtype=torch.float16)
    assert model[1].num_batches_tracked.dtype == torch.int64


def test_a_recorded_half_is_honoured():
    eager, model = build_both(_model)
    model.half()
    torchdefer.materialize_module(model)
    assert_same_module(model, eager.half())


def test_materialize_tensor_takes_dtype_and_keeps_parameter_ness():
    eager, model = build_both(nn.Linear, 4, 3)
    real = torchdefer.materialize_tensor(model.weight, dtype=torch.bfloat16)
    assert_same_tensor(real, nn.Parameter(eager.weight.to(torch.bfloat16)), "weight")
    assert torchdefer.materialize_tensor(model.weight, dtype=torch.bfloat16) is real


def test_tied_weights_stay_tied_with_dtype():
    def build():
        m = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5, bias=False))
        m[1].weight = m[0].weight
        return m

    eager, model = build_both(build)
    torchdefer.materialize_module(model, dtype=torch.bfloat16)
    assert model[1].weight is model[0].weight
    assert_same_module(model, eager.to(torch.bfloat16))


def test_an_integer_dtype_is_refused_as_module_to_refuses_it():
    model = torchdefer.deferred_init(nn.Linear, 2, 2)
    with pytest.raises(TypeError, match="not a floating point or complex dtype"):
        torchdefer.materialize_module(model, dtype=torch.int32)
