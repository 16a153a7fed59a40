"""Deferred values written into real tensors (collectives: tests/distributed/test_api.py)."""

import pytest
import torch
from torch import nn

import torchdefer
from parity import build_both
from torchdefer.recorder import RecordingError


def test_eager_module_loads_a_deferred_state_dict_with_the_eager_values():
    eager, deferred = build_both(lambda: nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)))
    target = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    target.load_state_dict(deferred.state_dict())
    for (name, got), ref in zip(target.state_dict().items(), eager.state_dict().values(),
                                strict=True):
        assert torch.equal(got, ref), name
    assert torchdefer.is_deferred(deferred)  # reading values materializes nothing


def test_in_place_ops_on_real_tensors_read_the_deferred_values():
    eager, deferred = build_both(torch.randn, 4)
    real = torch.zeros(4)
    real.add_(deferred)
    real[1:] = deferred[:3]
    out = torch.zeros(4)
    torch.mul(deferred, 2, out=out)
    expected = torch.zeros(4).add_(eager)
    expected[1:] = eager[:3]
    assert torch.equal(real, expected) and torch.equal(out, eager * 2)


def test_writing_deferred_values_into_a_real_tensor_inside_deferred_init_is_refused():
    real = torch.zeros(3)
    with pytest.raises(RecordingError, match="outside deferred_init"):
        torchdefer.deferred_init(lambda: real.copy_(torch.randn(3)))

