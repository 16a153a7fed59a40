"""fake_mode: fake tensors that report a real device, with no storage and no recording."""

import psutil
import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.fake import FakeTensorError


def test_factories_inside_fake_mode_give_fake_tensors_on_the_requested_device():
    with torchdefer.fake_mode():
        a = torch.empty(3, 4, device="cuda")
        b = torch.zeros_like(a)
        c = torch.randn(2, dtype=torch.float16)
    assert all(torchdefer.is_fake(t) for t in (a, b, c))
    assert a.is_cuda and b.device == torch.device("cuda", 0)
    assert c.device.type == "cpu" and c.dtype == torch.float16
    assert not torchdefer.is_deferred(a)


def test_ops_on_fake_tensors_give_eager_shapes_dtypes_and_devices():
    with torchdefer.fake_mode():
        x = torch.empty(5, 3, device="cuda")
    real = torch.empty(5, 3)
    for op in (lambda t: t @ t.T, lambda t: t.sum(0), lambda t: t.t().contiguous(),
               lambda t: t[1:, None], lambda t: t.to(torch.float64)):
        fake, ref = op(x), op(real)
        assert torchdefer.is_fake(fake)
        assert fake.shape == ref.shape and fake.dtype == ref.dtype and fake.stride() == ref.stride()
        assert fake.device == x.device


def test_fake_mode_allocates_nothing_for_a_huge_model():
    rss = psutil.Process().memory_info().rss
    with torchdefer.fake_mode():
        m = nn.Linear(100_000, 100_000, device="cuda")
    assert psutil.Process().memory_info().rss - rss < 128 * 2**20
    assert m.weight.is_cuda and isinstance(m.weight, nn.Parameter)


def test_reading_the_data_of_a_plain_fake_tensor_says_what_to_do():
    with torchdefer.fake_mode():
        x = torch.ones(2)
    with pytest.raises(FakeTensorError, match="deferred_init"):
        x.tolist()
    with pytest.raises(FakeTensorError, match="needs the data"):
        x.sum().item()


def test_fake_cuda_false_refuses_a_device_this_host_lacks():
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    with torchdefer.fake_mode(fake_cuda=False), pytest.raises(RuntimeError, match="fake_cuda=True"):
        torch.empty(2, device="cuda")


def test_fake_mode_leaves_nothing_active():
    with torchdefer.fake_mode():
        torch.empty(1)
    assert not torchdefer.is_fake(torch.empty(1))
    assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None


def test_plain_fake_tensors_cannot_enter_a_recording():
    with torchdefer.fake_mode():
        x = torch.ones(2)
    with pytest.raises(RuntimeError, match="records nothing"):
        torchdefer.deferred_init(lambda: torch.ones(2) + x)


def test_is_fake_is_false_for_real_tensors_and_other_objects():
    assert not torchdefer.is_fake(torch.ones(1))
    assert not torchdefer.is_fake(3)


def test_moving_fake_tensors_between_devices_this_host_may_lack():
    with torchdefer.fake_mode():
        x = torch.ones(2, 3)
    y = x.to("cuda")
    assert y.is_cuda and y.to("cuda") is y
    assert y.to(torch.float16).dtype == torch.float16 and y.to(torch.float16).is_cuda
    assert y.cpu().device.type == "cpu" and x.cuda(0).device == torch.device("cuda", 0)
    z = torch.empty_like(y).copy_(x)
    assert z.is_cuda


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.t().contiguous(),
        lambda t: t[1:, None],
        lambda t: t[[0, 2]],
        lambda t: t.new_tensor([1.0, 2.0]),
        lambda t: t.new_zeros(2),
        lambda t: t.half(),
        lambda t: t.index_select(0, t.new_tensor([0, 1], dtype=torch.long)),
    ],
)
def test_fake_cuda_tensor_methods_work_on_a_host_without_gpu(op):
    with torchdefer.fake_mode():
        x = torch.empty(5, 3, device="cuda")
    out = op(x)
    assert torchdefer.is_fake(out) and out.is_cuda
    assert out.shape == op(torch.empty(5, 3)).shape
