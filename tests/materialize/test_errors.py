"""Errors: one base class, and replay failures that keep their original type."""

import pickle

import pytest
import torch

import torchdefer
from torchdefer.descriptors import DescriptorMismatch
from torchdefer.fake import FakeTensorError
from torchdefer.materialize import (
    DeviceUnavailableError,
    ExternalTensorModifiedError,
    ReplayError,
    SwapError,
)
from torchdefer.recorder import RecordingError


def _failing_op(error: Exception):
    def op(*args, **kwargs):
        raise error

    return op


def _deferred_with_failing_replay(error: Exception) -> torch.Tensor:
    t = torchdefer.deferred_init(lambda: torch.ones(3) + 1)
    t._value.node.op = _failing_op(error)  # break the recording on purpose
    return t


@pytest.mark.parametrize(
    "error_class",
    [RecordingError, ReplayError, DeviceUnavailableError, ExternalTensorModifiedError,
     SwapError, FakeTensorError],
)
def test_every_torchdefer_error_is_a_torchdefer_error_and_still_a_runtime_error(error_class):
    assert issubclass(error_class, torchdefer.TorchdeferError)
    assert issubclass(error_class, RuntimeError)


def test_descriptor_mismatch_is_a_torchdefer_error_and_still_a_type_error():
    assert issubclass(DescriptorMismatch, torchdefer.TorchdeferError)
    assert issubclass(DescriptorMismatch, TypeError)


def test_out_of_memory_during_replay_stays_catchable_as_out_of_memory():
    t = _deferred_with_failing_replay(torch.OutOfMemoryError("CUDA out of memory (simulated)"))
    with pytest.raises(torch.OutOfMemoryError, match=r"While replaying .*test_errors.py.*simulated"):
        torchdefer.materialize_tensor(t)


def test_value_error_during_replay_is_a_value_error_and_a_replay_error():
    t = _deferred_with_failing_replay(ValueError("bad value"))
    with pytest.raises(ValueError, match="bad value") as info:
        torchdefer.materialize_tensor(t)
    assert isinstance(info.value, ReplayError)
    assert isinstance(info.value, torchdefer.TorchdeferError)
    assert isinstance(info.value.__cause__, ValueError)
    assert "While replaying" in str(info.value)


def test_error_with_its_own_constructor_keeps_type_and_attributes():
    class LibraryError(Exception):
        def __init__(self, code: int, text: str):
            super().__init__(text)
            self.code = code

    t = _deferred_with_failing_replay(LibraryError(7, "library failed"))
    with pytest.raises(LibraryError, match="library failed") as info:
        torchdefer.materialize_tensor(t)
    assert info.value.code == 7


def test_key_error_message_reads_plainly():
    t = _deferred_with_failing_replay(KeyError("missing"))
    with pytest.raises(KeyError) as info:
        torchdefer.materialize_tensor(t)
    assert str(info.value).startswith("While replaying")


def test_replay_error_of_original_type_survives_pickling():
    t = _deferred_with_failing_replay(ValueError("bad value"))
    with pytest.raises(ValueError) as info:
        torchdefer.materialize_tensor(t)
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is type(info.value) and str(copy) == str(info.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_out_of_memory_during_replay_is_a_torch_out_of_memory_error():
    huge = torchdefer.deferred_init(torch.zeros, 1 << 42, device="cuda")  # 16 TiB
    with pytest.raises(torch.OutOfMemoryError, match="While replaying"):
        torchdefer.materialize_tensor(huge)
