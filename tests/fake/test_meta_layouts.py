"""Fake tensors report the strides eager kernels give on their device."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdefer
from parity import assert_same_tensor

FACTORS = {
    "svd_vh": lambda a: torch.linalg.svd(a)[2],
    "svd_reduced_vh": lambda a: torch.linalg.svd(a[:, :3], full_matrices=False)[2],
    "eig_vectors": lambda a: torch.linalg.eig(a)[1],
    "batched_eig_vectors": lambda a: torch.linalg.eig(a.expand(2, 4, 4))[1],
    "qr_q": lambda a: torch.linalg.qr(a)[0],
    "eigh_vectors": lambda a: torch.linalg.eigh(a + a.T)[1],
}


@pytest.mark.parametrize("name", sorted(FACTORS))
def test_layout_of_linear_algebra_results_on_cpu_is_eagers(name):
    a = torch.randn(4, 4)
    eager = FACTORS[name](a)
    with torchdefer.fake_mode():
        fake = FACTORS[name](torch.randn(4, 4))
    assert fake.stride() == eager.stride() and fake.is_contiguous() == eager.is_contiguous()


def _permuted(size, perm, narrow_dim):
    t = torch.ones([size[p] for p in perm]).permute([perm.index(i) for i in range(len(size))])
    if narrow_dim is not None and t.shape[narrow_dim] > 1:
        t = t.narrow(narrow_dim, 0, t.shape[narrow_dim] - 1)
    return t


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_batch_norm_outputs_take_the_kernels_layout_for_any_input_layout(data):
    size = data.draw(st.lists(st.integers(1, 3), min_size=2, max_size=5))
    size[1] = data.draw(st.integers(2, 3))
    perm = data.draw(st.permutations(range(len(size))))
    narrow = data.draw(st.none() | st.integers(0, len(size) - 1))
    channels = _permuted(size, perm, narrow).shape[1]
    if _permuted(size, perm, narrow).numel() // channels < 2:
        return

    def build():
        x = _permuted(size, perm, narrow)
        out = torch.ops.aten.native_batch_norm.default(
            x, None, None, torch.zeros(channels), torch.ones(channels), True, 0.1, 1e-5
        )[0]
        return out, out.t().contiguous() if out.dim() == 2 else out.flatten(1).contiguous()

    eager = build()
    deferred = torchdefer.deferred_init(build)
    for e, d in zip(eager, deferred, strict=True):
        assert d.stride() == e.stride()  # what user code sees while building
        assert_same_tensor(torchdefer.materialize_tensor(d), e)


def test_like_factories_keep_the_strides_of_size_one_dims_as_eager():
    def build():
        t = torch.zeros(1, 5).t()
        return torch.randn_like(t), torch.empty_like(t).fill_(1), t.clone(), t.double()

    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    for e, d in zip(eager, deferred, strict=True):
        assert d.stride() == e.stride()
        assert_same_tensor(torchdefer.materialize_tensor(d), e)


CONVOLUTIONS = {
    "conv2d": lambda x: torch.nn.functional.conv2d(x, torch.ones(4, 3, 3, 3, dtype=x.dtype)),
    "conv2d_stride_bias": lambda x: torch.nn.functional.conv2d(
        x, torch.ones(4, 3, 2, 2, dtype=x.dtype), torch.ones(4, dtype=x.dtype), stride=2),
    "conv2d_1x1": lambda x: torch.nn.functional.conv2d(x, torch.ones(4, 3, 1, 1, dtype=x.dtype)),
    "conv2d_groups": lambda x: torch.nn.functional.conv2d(x, torch.ones(6, 1, 3, 3, dtype=x.dtype), groups=3),
    "conv_transpose2d": lambda x: torch.nn.functional.conv_transpose2d(x, torch.ones(3, 2, 3, 3, dtype=x.dtype)),
    "conv1d_of_a_row": lambda x: torch.nn.functional.conv1d(x[:, :, 0], torch.ones(4, 3, 2, dtype=x.dtype)),
    "conv3d": lambda x: torch.nn.functional.conv3d(x.unsqueeze(2), torch.ones(4, 3, 1, 3, 3, dtype=x.dtype)),
    "conv2d_module": lambda x: torch.nn.Conv2d(3, 5, 3, dtype=x.dtype).to(
        memory_format=torch.channels_last)(x),
}
INPUTS = {
    "channels_last": lambda: torch.arange(150.0).reshape(2, 3, 5, 5).contiguous(
        memory_format=torch.channels_last),
    "contiguous": lambda: torch.arange(150.0).reshape(2, 3, 5, 5),
    "transposed": lambda: torch.arange(150.0).reshape(2, 3, 5, 5).transpose(2, 3),
    "double_channels_last": lambda: torch.arange(150.0, dtype=torch.float64).reshape(
        2, 3, 5, 5).contiguous(memory_format=torch.channels_last),
    "bfloat16_channels_last": lambda: torch.arange(150.0, dtype=torch.bfloat16).reshape(
        2, 3, 5, 5).contiguous(memory_format=torch.channels_last),
}


@pytest.mark.parametrize("conv", sorted(CONVOLUTIONS))
@pytest.mark.parametrize("layout", sorted(INPUTS))
def test_a_convolution_reports_the_layout_eagers_backend_gives(conv, layout):
    def build():
        torch.manual_seed(0)
        out = CONVOLUTIONS[conv](INPUTS[layout]())
        return out, out.reshape(-1)  # a view where eager's layout allows one, else a copy

    eager = build()
    deferred = torchdefer.deferred_init(build)
    assert deferred[0].stride() == eager[0].stride()
    real = [torchdefer.materialize_tensor(t) for t in deferred]
    for got, want in zip(real, eager):
        assert_same_tensor(got, want.detach() if not want.requires_grad else want)
    shares = real[0].untyped_storage().data_ptr() == real[1].untyped_storage().data_ptr()
    assert shares == (eager[0].untyped_storage().data_ptr() == eager[1].untyped_storage().data_ptr())
