"""Views taken under inference mode keep eager's autograd metadata on fake tensors.

``p.mT``, ``p.mH``, ``p.T`` and ``p.H`` of a tensor with Python dispatch lose
``requires_grad`` under inference mode in PyTorch itself (its own
``FakeTensorMode`` too); eager keeps it. So do composite views (``reshape``,
``view_as``, ``movedim``, ``unflatten``; fuzz seed 20261205). Found by the
fuzzer's ambient focus.
"""

import pytest
import torch
from torch import nn

import torchdefer

VIEWS = {
    "mT": lambda p: p.mT, "mH": lambda p: p.mH, "T": lambda p: p.T, "H": lambda p: p.H,
    "t": lambda p: p.t(), "transpose": lambda p: p.transpose(0, 1),
    "reshape": lambda p: p.reshape(-1), "view_as": lambda p: p.view_as(p),
    "movedim": lambda p: p.movedim(0, 1), "unflatten": lambda p: p.unflatten(1, (3, 1)),
    "flatten": lambda p: p.flatten(), "reshape_as": lambda p: p.reshape_as(p.t()),
}


def _describe(t: torch.Tensor):
    return (t.requires_grad, t.is_inference(), t.is_conj(), tuple(t.shape), t.stride(), t.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
@pytest.mark.parametrize("name", sorted(VIEWS))
def test_a_view_under_inference_mode_is_described_as_eagers(name, dtype):
    def build():
        p = nn.Parameter(torch.ones(2, 3, dtype=dtype))
        with torch.inference_mode():
            return VIEWS[name](p)

    eager = build()
    with torchdefer.fake_mode():
        fake = build()
    lazy = torchdefer.deferred_init(build)
    assert _describe(fake) == _describe(eager)
    assert _describe(lazy) == _describe(eager)
    real = torchdefer.materialize_tensor(lazy)
    assert _describe(real) == _describe(eager)
    assert torch.equal(real, eager)


def test_to_another_tensor_of_a_fake_inference_tensor_works_as_in_eager():
    with torch.inference_mode():
        eager = torch.ones(3)
    with torchdefer.fake_mode():
        with torch.inference_mode():
            fake = torch.ones(3)
        inside = (fake.to(fake), fake.to(torch.ones(1, dtype=torch.float64)))
    outside = (fake.to(fake), fake.to(torch.ones(1, dtype=torch.float64)))
    reference = (eager.to(eager), eager.to(torch.ones(1, dtype=torch.float64)))
    for got in (inside, outside):
        for a, b in zip(got, reference):
            assert torchdefer.is_fake(a)
            assert (a.shape, a.dtype, a.is_inference()) == (b.shape, b.dtype, b.is_inference())


SOURCES = {
    "parameter": lambda: nn.Parameter(torch.ones(2, 3)),
    "leaf requiring grad": lambda: torch.ones(2, 3, requires_grad=True),
    "non-leaf": lambda: nn.Parameter(torch.ones(2, 3)) * 2,
    "view of a parameter": lambda: nn.Parameter(torch.ones(3, 2)).t(),
    # a view made a leaf by requires_grad_(): its views take the base's (fuzz seed 20261208)
    "leaf view requiring grad": lambda: torch.arange(6.0).sin().reshape(2, 3).requires_grad_(),
}


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views_of_every_kind_of_grad_tensor_under_inference_mode_are_eagers(name, source):
    def build():
        p = SOURCES[source]()
        with torch.inference_mode():
            return VIEWS[name](p)

    eager = build()
    lazy = torchdefer.deferred_init(build)
    want = (*_describe(eager), eager.is_leaf)
    assert (*_describe(lazy), lazy.is_leaf) == want
    real = torchdefer.materialize_tensor(lazy)
    assert _describe(real) == _describe(eager)
    assert torch.equal(real, eager)
