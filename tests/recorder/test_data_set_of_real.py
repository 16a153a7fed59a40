"""``real.data = deferred`` inside a recording.

``Tensor.data``'s setter hands only ``self`` to ``__torch_function__``, so a
real target with a deferred value reached PyTorch's ``set_data`` and failed
("incompatible tensor type"; fuzz seed 20261207: ``torch.tensor(...)`` under
a meta default device is a real meta tensor, as in eager, then
``t.data = deferred * 1``). A real meta target takes the deferred tensor's
metadata, as eager's does; any other real target is refused with a clear error.

``real_meta.set_(deferred.untyped_storage(), ...)`` ran as eager code (all its
tensors real meta): the real tensor then aliased recorded memory, and after
materialization it no longer shared the deferred tensor's storage as eager's
does (fuzz seed 20261222). It is refused as a write to a real tensor.
"""

import pytest
import torch

import torchdefer


def _layout(t):
    return t.device, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype


def _meta_program():
    torch.set_default_device("meta")
    try:
        t5 = torch.arange(7, dtype=torch.int32)
        t6 = torch.tensor([-0.75, 1.0, 0.25])
        t6.data = t5.select(0, -1) * 1
        u = torch.tensor([1.0])
        u.data = torch.zeros(2, 3).t()[1:]
        return t6, u
    finally:
        torchdefer._compat.restore_default_device(None)


def test_a_real_meta_tensor_takes_a_deferred_tensors_metadata_as_in_eager():
    eager = _meta_program()
    deferred = torchdefer.deferred_init(_meta_program)
    for got, want in zip(deferred, eager, strict=True):
        assert _layout(got) == _layout(want)


def test_a_real_tensor_given_a_deferred_value_is_refused_with_the_line():
    real = torch.ones(3)

    def build():
        real.data = torch.zeros(3)

    with pytest.raises(torchdefer.TorchdeferError, match=r"Tensor.data.__set__ at .*test_data_set"):
        torchdefer.deferred_init(build)
    assert torch.equal(real, torch.ones(3)) and real.device.type == "cpu"


def test_the_setter_is_torchs_own_again_after_the_recording():
    torchdefer.deferred_init(_meta_program)
    assert "data" not in torch.Tensor.__dict__
    t = torch.zeros(2)
    t.data = torch.ones(3)
    assert torch.equal(t, torch.ones(3))


def _real_meta_set_to_a_deferred_storage(storage):
    torch.set_default_device("meta")
    try:
        real = torch.tensor([3, 7, 7, 5, 4])  # a real meta tensor, as in eager
        deferred = torch.arange(0, 16, 2).reshape(-1, 1)
        real.chunk(2)[1].set_(*storage(deferred))
        return real
    finally:
        torchdefer._compat.restore_default_device(None)


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize("storage", [
    lambda t: (t.untyped_storage(), 6, (2,), (1,)),
    lambda t: (t.untyped_storage(),),
    lambda t: (t.storage(),),  # a TypedStorage (deprecated, still accepted)
])
def test_a_real_meta_tensor_set_to_a_deferred_tensors_storage_is_refused(storage):
    _real_meta_set_to_a_deferred_storage(storage)  # eager runs it
    with pytest.raises(torchdefer.TorchdeferError,
                       match=r"set_.* at .*test_data_set_of_real.py:\d+.* writes in place to a real "
                             r"tensor .*a real meta tensor"):
        torchdefer.deferred_init(_real_meta_set_to_a_deferred_storage, storage)


def test_real_meta_tensors_set_to_each_others_storage_still_run_as_in_eager():
    def build():
        with torch.device("meta"):
            a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0])
            b.set_(a.untyped_storage(), 1, (2,), (1,))
            return a, b

    eager = build()
    a, b = torchdefer.deferred_init(build)
    assert not torchdefer.is_fake(a) and not torchdefer.is_fake(b)
    assert b.untyped_storage()._cdata == a.untyped_storage()._cdata
    assert _layout(b) == _layout(eager[1])
