"""``set_``, ``resize_``, ``as_strided`` and storage objects of deferred tensors.

``x.set_(y)`` makes ``x`` a view of ``y``'s storage: later writes through either
reach the other, in eager code and after materialization, in any order.
"""

import itertools

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_tensor, build_both
from torchdefer.fake import FakeTensorError
from torchdefer.recorder import RecordingError


def set_to_tensor():
    x, y = torch.zeros(3), torch.randn(3)
    v = y[1:]
    x.set_(y)
    y.add_(1)
    x.mul_(3)
    return x, y, v


def set_to_a_view():
    y = torch.arange(12.0).reshape(3, 4)
    x = torch.zeros(2)
    x.set_(y[1])
    y.add_(1)
    return x, y


def set_to_storage_with_offset():
    y = torch.arange(6.0)
    x = torch.zeros(3)
    x.set_(y.untyped_storage(), 1, (2,), (2,))
    y.add_(1)
    x.mul_(-1)
    return x, y


def set_to_whole_storage():
    y = torch.randn(6)
    x = torch.zeros(3)
    x.set_(y.untyped_storage())
    y.add_(1)
    return x, y


def set_to_typed_storage():
    y = torch.randn(2, 3)
    x = torch.zeros(3)
    x.set_(y.storage())
    x.add_(2)
    return x, y


def set_to_storage_of_another_dtype():
    y = torch.arange(6.0)
    x = torch.zeros(3, dtype=torch.int32)
    x.set_(y.untyped_storage(), 0, (6,), (1,))
    return x, y


def set_to_nothing_then_resized():
    x = torch.ones(3)
    v = x[:2]
    x.set_()
    x.resize_(4).fill_(2)
    return x, v


def resize_grow_and_shrink():
    x = torch.arange(4.0)
    v = x[1:3]
    x.resize_(2, 3)
    x[1].fill_(7)
    y = torch.arange(6.0)
    y.resize_(2)
    return x[0], v, y


def resize_as():
    x = torch.arange(6.0)
    x.resize_as_(torch.zeros(3, 2))
    x.add_(1)
    return (x,)


def as_strided_views():
    x = torch.arange(12.0)
    v = x.as_strided((3, 2), (1, 3), 2)
    v.mul_(2)
    y = x[:]
    x.as_strided_((3, 2), (1, 3), 2)
    x.add_(1)
    return x, v, y


def parameter_set_under_no_grad():
    p = nn.Parameter(torch.zeros(3))
    y = torch.randn(3)
    with torch.no_grad():
        p.set_(y)
    y.mul_(2)
    return p, y


PROGRAMS = [
    set_to_tensor, set_to_a_view, set_to_storage_with_offset, set_to_whole_storage,
    set_to_typed_storage, set_to_storage_of_another_dtype, set_to_nothing_then_resized,
    resize_grow_and_shrink, resize_as, as_strided_views, parameter_set_under_no_grad,
]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_storage_swaps_replay_like_eager_in_every_order(program):
    n = len(program())
    for order in itertools.permutations(range(n)):
        eager, deferred = build_both(program)
        reals = {i: torchdefer.materialize_tensor(deferred[i]) for i in order}
        for i in range(n):
            if program is set_to_nothing_then_resized and i == 0:
                assert reals[i].shape == eager[i].shape  # 4th element uninitialized
                continue
            assert_same_tensor(reals[i], eager[i], f"{program.__name__}[{i}] order {order}")


def test_tensors_set_to_one_storage_share_it_after_materialization():
    _, (x, y, _) = build_both(set_to_tensor)
    real_x, real_y = torchdefer.materialize_tensor(x), torchdefer.materialize_tensor(y)
    assert real_x.untyped_storage().data_ptr() == real_y.untyped_storage().data_ptr()


def test_storage_of_a_deferred_tensor_reports_its_device_and_size():
    def build():
        t = torch.empty(2, 3, device="cuda", dtype=torch.float16)
        return t, t.untyped_storage(), t.storage()

    t, untyped, typed = torchdefer.deferred_init(build)
    eager = torch.empty(2, 3, dtype=torch.float16)
    assert untyped.device == t.device == typed.device
    assert untyped.nbytes() == eager.untyped_storage().nbytes()
    assert typed.size() == eager.storage().size() and typed.dtype == torch.float16
    assert t.untyped_storage() is untyped
    assert untyped.is_pinned() == typed.is_pinned() == eager.untyped_storage().is_pinned()
    assert typed.is_shared() == eager.storage().is_shared()


@pytest.mark.parametrize(
    "write",
    [
        lambda s: s.fill_(1),
        lambda s: s.resize_(0),
        lambda s: s.copy_(torch.ones(3).untyped_storage()),
        lambda s: s.__setitem__(0, 1),
    ],
)
def test_writing_through_a_storage_object_says_to_write_through_the_tensor(write):
    t = torchdefer.deferred_init(torch.zeros, 3)
    with pytest.raises(FakeTensorError, match=r"not recorded.*Write through the tensor"):
        write(t.untyped_storage())


@pytest.mark.parametrize("read", [lambda s: s.tolist(), lambda s: s[0], lambda s: s.cpu(), list])
def test_reading_a_storage_object_says_to_read_the_tensor(read):
    t = torchdefer.deferred_init(torch.zeros, 3)
    with pytest.raises(FakeTensorError, match=r"needs the data.*Read the tensor"):
        read(t.untyped_storage())
    with pytest.raises(FakeTensorError, match=r"needs the data.*Read the tensor"):
        read(t.storage())


def test_set_to_a_storage_no_deferred_tensor_holds_names_the_line_and_the_fix():
    real = torch.arange(4.0)

    def build():
        x = torch.zeros(2)
        x.set_(real.untyped_storage(), 0, (2,), (1,))

    with pytest.raises(RecordingError, match=r"set_.*no deferred tensor holds.*test_storage_swaps.py:\d+.*x.set_\(y\)"):
        torchdefer.deferred_init(build)


def _relaid(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1) * 1  # reads the elements in the order the strides give


@pytest.mark.parametrize("how", ["storage", "offset_and_size", "empty_stride", "tensor_offset",
                                 "other_size", "given_stride"])
def test_set_to_a_storage_with_the_same_sizes_keeps_the_strides_as_eager(how):
    """CPU and CUDA ``set_`` with no strides keep a tensor's strides when its sizes stay
    (resize_impl_ returns early); the meta kernel made them contiguous, so the deferred
    tensor reported other strides than eager's (fuzz seed 20261214: a size-1 diagonal
    whose stride 6 became 1)."""
    def build():
        keep = torch.arange(40.0)
        s = keep.untyped_storage()
        t = torch.arange(15.0).view(3, 5).t()[:, :2]  # (5, 2), strides (1, 5)
        if how == "storage":
            t = torch.arange(5.0).view(1, 5).diagonal()  # (1,), stride 6
            c = t.clone()
            t.set_(c.untyped_storage())
        elif how == "offset_and_size":
            t.set_(s, 0, (5, 2))
        elif how == "empty_stride":
            t.set_(s, 3, (5, 2), ())
        elif how == "tensor_offset":
            t.set_(keep, 1, (5, 2))
        elif how == "other_size":
            t.set_(s, 0, (2, 5))
        else:
            t.set_(s, 3, (5, 2), (2, 1))
        return t, _relaid(t), t.stride()

    eager, deferred = build_both(build)
    assert deferred[2] == eager[2]
    for i in (1, 0):
        assert_same_tensor(torchdefer.materialize_tensor(deferred[i]), eager[i], f"output {i}")
