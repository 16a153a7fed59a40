"""Real tensors from outside a recording: never a stale value.

An external tensor is referenced, not copied. Changes after recording that
bump its version were always caught; these do not: writes through ``.data``,
into the numpy array behind ``torch.from_numpy``, and ``swap_tensors``.
"""

import numpy as np
import pytest
import torch

import torchdefer
from parity import assert_same_tensor
from torchdefer.materialize import ExternalTensorModifiedError


def deferred_sum(external):
    return torchdefer.deferred_init(lambda: torch.ones(3) + external)


CHANGES = {
    "add_": lambda t: t.add_(1),
    "data_add_": lambda t: t.data.add_(1),
    "data_fill_": lambda t: t.data[1].fill_(7),
    "detach_copy_": lambda t: t.detach().copy_(torch.full((3,), 5.0)),
    "swap_tensors": lambda t: torch.utils.swap_tensors(t, torch.full((3,), 9.0)),
    "set_": lambda t: t.set_(torch.zeros(3)),
    "data_assign": lambda t: setattr(t, "data", torch.zeros(3)),
}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_an_external_changed_after_recording_is_detected(name):
    external = torch.arange(3.0)
    out = deferred_sum(external)
    CHANGES[name](external)
    with pytest.raises(ExternalTensorModifiedError, match=r"test_externals.py:\d+.*clone"):
        torchdefer.materialize_tensor(out)


def test_writes_to_the_numpy_array_behind_an_external_are_detected():
    array = np.arange(3, dtype=np.float32)
    external = torch.from_numpy(array)
    out = deferred_sum(external)
    array[1] = 42
    with pytest.raises(ExternalTensorModifiedError, match="numpy"):
        torchdefer.materialize_tensor(out)


@pytest.mark.parametrize("make", [
    lambda: torch.arange(12.0).reshape(3, 4).t()[1:],  # a non-contiguous view
    lambda: torch.arange(6, dtype=torch.int64)[::2],
    lambda: torch.zeros(0, 3),
])
def test_an_external_left_alone_replays_like_eager(make):
    external = make()
    eager = external * 2
    out = torchdefer.deferred_init(lambda: external * 2)
    assert_same_tensor(torchdefer.materialize_tensor(out), eager)


def test_a_change_outside_the_elements_an_external_covers_is_not_a_change():
    base = torch.arange(6.0)
    external = base[2:4]
    eager = external + 1
    out = torchdefer.deferred_init(lambda: external + 1)
    base.data[5] = 100.0  # same storage, element not covered
    assert_same_tensor(torchdefer.materialize_tensor(out), eager)


READS = {
    "equal": lambda t, h: torch.equal(t, h),
    "item": lambda t, h: t[1].item(),
    "tolist": lambda t, h: t.tolist(),
    "nonzero": lambda t, h: t.nonzero(),
    "numpy": lambda t, h: t.numpy().sum(),
    "bool": lambda t, h: bool(t[1]),
    "item_of_a_result": lambda t, h: h.max().item(),
}


@pytest.mark.parametrize("read", sorted(READS))
def test_an_external_read_while_recording_is_still_checked_when_materialized(read):
    # A data read replays the external while recording; its storage is the
    # user's numpy memory and must not be kept as a replay result, or the later
    # change would be read back silently.
    array = np.arange(4, dtype=np.float32)

    def build():
        t = torch.from_numpy(array)
        h = t.type(torch.float16)
        READS[read](t, h)
        return h

    lazy = torchdefer.deferred_init(build)
    array += 1
    with pytest.raises(ExternalTensorModifiedError, match="numpy"):
        torchdefer.materialize_tensor(lazy)


def test_an_inference_tensor_from_outside_is_referenced_and_its_writes_detected():
    """An inference tensor keeps no version counter: reading it crashed the
    recording (fuzz seed 20261215); a write to it shows in its digest."""
    with torch.inference_mode():
        external = torch.arange(3.0)
    eager = external * 2
    out = torchdefer.deferred_init(lambda: external * 2)
    assert_same_tensor(torchdefer.materialize_tensor(out), eager)
    out = torchdefer.deferred_init(lambda: external * 2)
    with torch.inference_mode():
        external.add_(1)  # no version bump to see
    with pytest.raises(ExternalTensorModifiedError, match="without a version bump"):
        torchdefer.materialize_tensor(out)


def test_an_inference_tensor_made_under_a_meta_default_device_is_recorded():
    """The fuzz program of seed 20261215: ``torch.tensor`` in inference mode with
    ``torch.set_default_device('meta')``."""
    def build():
        torch.set_default_device("meta")
        try:
            with torch.inference_mode():
                t = torch.tensor([0.0, 2.0, -0.5])
            return torch.where(t > 0, t, torch.full((3,), 3.0))
        finally:
            torch.set_default_device(None)

    eager = build()
    out = torchdefer.deferred_init(build)
    real = torchdefer.materialize_tensor(out)
    assert real.device == eager.device and real.shape == eager.shape and real.dtype == eager.dtype
