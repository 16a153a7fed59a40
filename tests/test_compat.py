"""The version shims in torchdefer._compat, checked against what torch itself does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer import _compat


class SetsDefaultDevice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.set_default_device("cpu")
        self.linear = nn.Linear(3, 3)


def test_default_device_set_by_a_constructor_is_undone_and_torch_still_answers():
    # torch <= 2.8 crashed here: set_default_device(None) left a None that
    # get_default_device() read `.device` from.
    torchdefer.deferred_init(SetsDefaultDevice)
    assert _compat.default_device_context() is None
    assert torch.get_default_device() == torch.device("cpu")
    torch.manual_seed(0)
    eager = nn.Linear(3, 3)
    torch.manual_seed(0)
    assert torch.equal(nn.Linear(3, 3).weight, eager.weight)


def test_default_device_set_before_deferred_init_is_put_back():
    torch.set_default_device("meta")
    try:
        before = _compat.default_device_context()
        torchdefer.deferred_init(SetsDefaultDevice)
        assert _compat.default_device_context().device == before.device
        assert torch.get_default_device() == torch.device("meta")
    finally:
        _compat.restore_default_device(None)
    assert torch.get_default_device() == torch.device("cpu")


@pytest.mark.skipif(
    not hasattr(torch, "hash_tensor"), reason="no torch.hash_tensor in this torch to compare the fallback with"
)
@pytest.mark.parametrize(
    "t",
    [
        torch.randn(7),
        torch.randn(4, 5).half(),
        torch.randn(6).double(),
        torch.randint(-(2**31), 2**31 - 1, (9,), dtype=torch.int32),
        torch.randint(-(2**15), 2**15 - 1, (8,), dtype=torch.int16),
        torch.randint(-(2**62), 2**62, (5,), dtype=torch.int64),
        torch.tensor([True, False, True]),
        torch.tensor([3.5]),
    ],
    ids=lambda t: f"{t.dtype}x{t.numel()}",
)
def test_hash_tensor_fallback_has_the_bits_of_torch_hash_tensor(t):
    expected = torch.hash_tensor(t).view(torch.int64)
    assert torch.equal(_compat._xor_fold(t), expected)
