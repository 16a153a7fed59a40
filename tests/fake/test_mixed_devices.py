"""Ops mixing devices raise where eager PyTorch raises, and only there.

Eager's rule (see ``fake/_cross_device.py``): an accelerator kernel's dispatcher
wrapper wants every tensor argument on one device unless the op says
``device_check: NoCheck``; TensorIterator ops take CPU 0-dim inputs along;
copies, shape-only ops and indexing with CPU indices mix freely. This host has
no GPU to compare with, so each case states what eager CUDA does.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdefer

MESSAGE = r"Expected all tensors to be on the same device.*called at .*test_mixed_devices.py:\d+"

# (case, eager on CUDA raises)
CASES = {
    "binary_op": (lambda c, p: c + p, True),
    "in_place_binary_op": (lambda c, p: c.mul_(p), True),
    "cpu_0_dim_tensor_operand": (lambda c, p: c + torch.tensor(2.0), False),
    "cpu_0_dim_tensor_first": (lambda c, p: torch.tensor(2.0) * c, False),
    "cuda_0_dim_into_cpu_tensor": (lambda c, p: p + c[0, 0], True),
    "matmul": (lambda c, p: c @ p, True),
    "linear_with_cpu_bias": (lambda c, p: F.linear(c, c, torch.zeros(3)), True),
    "cat": (lambda c, p: torch.cat([c, p]), True),
    "where_with_cpu_scalar": (lambda c, p: torch.where(c > 0, c, torch.tensor(0.0)), False),
    "where_with_cpu_tensor": (lambda c, p: torch.where(c > 0, c, p), True),
    "addcmul_with_cpu_scalar": (lambda c, p: torch.addcmul(c, c, torch.tensor(2.0)), False),
    "lerp": (lambda c, p: torch.lerp(c, p, 0.5), True),
    "clamp_with_cpu_bound": (lambda c, p: c.clamp(min=torch.tensor(0.0)), True),
    "embedding_with_cpu_indices": (lambda c, p: F.embedding(torch.tensor([0, 1]), c), True),
    "index_select_with_cpu_index": (lambda c, p: c.index_select(0, torch.tensor([0, 1])), True),
    "indexing_with_cpu_indices": (lambda c, p: c[torch.tensor([0, 1])], False),
    "index_put_with_cpu_indices": (
        lambda c, p: c.index_put_((torch.tensor([0]),), torch.tensor(5.0)),
        False,
    ),
    "masked_fill_with_cpu_value": (lambda c, p: c.masked_fill(c > 0, torch.tensor(1.0)), False),
    "copy_between_devices": (lambda c, p: c.copy_(p), False),
    "setitem_from_cpu": (lambda c, p: c.__setitem__(0, p[0]), False),
    # torch >= 2.15 sends this to index_fill_ only when the index is on c's device
    "setitem_with_a_list_index": (lambda c, p: c.__setitem__(([0, 2], 1), 5.0), False),
    "index_fill_with_cpu_index": (lambda c, p: c.index_fill_(0, torch.tensor([0, 1]), 1.0), True),
    "to_another_device": (lambda c, p: p.to(c.device) + c, False),
    "view_as_across_devices": (lambda c, p: c.view_as(p), False),
    "set_to_other_device": (lambda c, p: c.set_(p), True),
    "two_gpus": (lambda c, p: c + c.to("cuda:1"), True),
    "foreach_across_devices": (lambda c, p: torch._foreach_add([c], [p]), True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_mixing_devices_raises_where_eager_cuda_raises(name):
    op, raises = CASES[name]

    def build():
        return op(torch.ones(3, 3, device="cuda"), torch.ones(3, 3))

    if raises:
        with pytest.raises(RuntimeError, match=MESSAGE):
            torchdefer.deferred_init(build)
        with torchdefer.fake_mode(), pytest.raises(RuntimeError, match=MESSAGE):
            build()
    else:
        torchdefer.deferred_init(build)


@pytest.mark.parametrize("name", sorted(set(CASES) - {"two_gpus"}))
def test_the_same_ops_on_one_device_are_recorded(name):
    op, _ = CASES[name]
    torchdefer.deferred_init(lambda: op(torch.ones(3, 3), torch.ones(3, 3)))


def test_a_deferred_cuda_module_called_on_a_cpu_input_raises_as_eager():
    m = torchdefer.deferred_init(nn.Linear, 3, 3, device="cuda")
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device.*mat1"):
        m(torch.ones(2, 3))
