"""Fake tensors report the strides eager kernels give on their device."""

import pytest
import torch

import torchdefer

FACTORS = {
    "svd_vh": lambda a: torch.linalg.svd(a)[2],
    "svd_reduced_vh": lambda a: torch.linalg.svd(a[:, :3], full_matrices=False)[2],
    "eig_vectors": lambda a: torch.linalg.eig(a)[1],
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
