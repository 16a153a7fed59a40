"""Tensors recorded on the meta device have the meta kernels' layouts, as eager's do.

``fake/_layout.py`` restrides the meta kernels' outputs to what the CPU and
CUDA kernels give (size-1 strides of elementwise ops, ``empty_like``,
batch norm, convolution...). For a tensor that *is* on meta, eager runs the
meta kernels themselves: ``torch.zeros(1, 5, device="meta").t() * 1`` has
strides ``(1, 1)`` there and ``(1, 5)`` on the CPU (fuzz seed 20261205:
``t.data = t * 1`` under ``set_default_device("meta")`` reported the CPU's).
"""

import pytest
import torch
from torch import nn

import torchdefer

PROGRAMS = {
    "mul of a transposed row": lambda d: torch.zeros(1, 5, device=d).t() * 1,
    "cumsum then transpose then mul": lambda d: torch.zeros(1, 5, device=d).cumsum(0).transpose(0, -1) * 1,
    "add of two layouts": lambda d: torch.zeros(3, 1, device=d).t() + torch.zeros(1, 3, device=d),
    "empty_like of a transposed row": lambda d: torch.empty_like(torch.zeros(1, 5, device=d).t()),
    "clone of a transposed row": lambda d: torch.zeros(1, 5, device=d).t().clone(),
    "copysign": lambda d: torch.copysign(torch.zeros(4, 3, device=d).t(), 1.0),
    "batch_norm of a transposed input": lambda d: nn.functional.batch_norm(
        torch.zeros(3, 2, device=d).t(), None, None, training=True),
    "conv of channels_last": lambda d: nn.functional.conv2d(
        torch.zeros(1, 2, 4, 4, device=d).to(memory_format=torch.channels_last),
        torch.zeros(3, 2, 1, 1, device=d)),
    "dropout mask": lambda d: torch.ops.aten.native_dropout(torch.zeros(3, 1, device=d).t(), 0.5, True)[1],
    "normal with a transposed std": lambda d: torch.normal(0.0, torch.ones(3, 2, device=d).t()),
}


def _layout(t: torch.Tensor):
    return t.device, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype


def _under_meta_default(program):
    torch.set_default_device("meta")
    try:
        return program(None)
    finally:
        torchdefer._compat.restore_default_device(None)


def _check_as_eager(build):
    eager = build()
    deferred = torchdefer.deferred_init(build)
    assert _layout(deferred) == _layout(eager)
    assert _layout(torchdefer.materialize_tensor(deferred)) == _layout(eager)


@pytest.mark.parametrize("how", ["device argument", "default device"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_meta_tensor_has_the_meta_kernels_layout(name, how):
    program = PROGRAMS[name]
    if how == "device argument":
        _check_as_eager(lambda: program("meta"))
    else:
        _check_as_eager(lambda: _under_meta_default(program))


def test_data_assigned_under_a_meta_default_device_keeps_the_meta_layout():
    def program(_):
        t = torch.randint(3, (1, 5), dtype=torch.float32).cumsum(0).transpose(0, -1)
        t.data = t * 1
        return t

    _check_as_eager(lambda: _under_meta_default(program))


def test_views_sharing_a_meta_storage_materialize_one_by_one_with_a_device():
    # The cache rebuilt the second over the first's meta storage on device=,
    # which set_ refuses ("a storage on different device").
    def build():
        a = torch.zeros(1, 5, device="meta").t() * 1
        b = a.reshape(5)
        b.add_(1)
        return a, b

    eager = build()
    for order in ((0, 1), (1, 0)):
        deferred = torchdefer.deferred_init(build)
        for i in order:
            got = torchdefer.materialize_tensor(deferred[i], device="cpu")
            assert _layout(got) == _layout(eager[i])
