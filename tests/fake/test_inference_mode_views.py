"""Views taken under inference mode keep eager's autograd metadata on fake tensors.

``p.mT``, ``p.mH``, ``p.T``, ``p.H`` and the composite views (``reshape``,
``view_as``, ``movedim``, ``unflatten``) of a tensor with Python dispatch lose
``requires_grad`` under inference mode in PyTorch itself (its own
``FakeTensorMode`` too); eager keeps it, and follows the base's later
``requires_grad_()`` (fuzz seeds 20261205, 20261230). All are
CompositeImplicitAutograd views that reach a dispatch mode whole there, run as
eager's backend key runs them (``_compat.decomposed_in_inference``).
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


COMPOSITE_VIEWS = {
    **{k: VIEWS[k] for k in ("reshape", "view_as", "movedim", "unflatten", "flatten",
                             "reshape_as")},
    "chunk": lambda t: t.chunk(2, 1)[1], "tensor_split": lambda t: t.tensor_split(2, 0)[0],
    "narrow": lambda t: t.narrow(1, 1, 2), "swapaxes": lambda t: t.swapaxes(0, 1),
    "expand_as": lambda t: t[:1].expand_as(t), "contiguous": lambda t: t.contiguous(),
    "torch.reshape": lambda t: torch.reshape(t, (3, 2)), "ravel": lambda t: t.ravel(),
    "split_with_sizes": lambda t: t.split([1, 2], 1)[1], "unsafe_view": lambda t: t.view(6),
}


def _view_facts(views, base):
    return [(v.requires_grad, v._is_view(), v._base is base, v.is_leaf, v.is_inference(),
             v.grad_fn is None, tuple(v.shape), v.stride()) for v in views]


@pytest.mark.parametrize("how", ["deferred_init", "fake_mode"])
@pytest.mark.parametrize("name", sorted(COMPOSITE_VIEWS))
def test_a_composite_view_under_inference_mode_follows_its_base_requiring_grad_later(name, how):
    # Eager decomposes these at the backend key, below ADInplaceOrView: their views
    # of a normal tensor are autograd views, whose requires_grad follows the base's
    # (fuzz seeds 20261205, 20261230: reshape's view stayed False).
    def build():
        base = torch.ones(2, 3)
        with torch.inference_mode():
            view = COMPOSITE_VIEWS[name](base)
            inner = torch.ones(2, 3)
            inner_view = COMPOSITE_VIEWS[name](inner)  # of an inference tensor: no autograd view
        base.requires_grad_()
        return base, view, inner, inner_view

    eager = build()
    if how == "fake_mode":
        with torchdefer.fake_mode():
            got = build()
    else:
        got = torchdefer.deferred_init(build)
    assert _view_facts(got[1:2], got[0]) == _view_facts(eager[1:2], eager[0])
    assert _view_facts(got[3:], got[2]) == _view_facts(eager[3:], eager[2])
    if how == "deferred_init":
        for g, e in zip(got, eager):
            assert torch.equal(torchdefer.materialize_tensor(g), e)


@pytest.mark.parametrize("name", ["reshape", "flatten", "narrow", "movedim"])
def test_writing_a_composite_view_made_in_inference_mode_is_eagers(name):
    # Of a base requiring grad: refused outside inference mode, as in eager (a
    # plain tensor's write was let through before); of a plain base: written.
    def build(requires_grad):
        base = torch.ones(2, 3) * 1
        base.requires_grad_(requires_grad)
        with torch.inference_mode():
            view = COMPOSITE_VIEWS[name](base)
        view.mul_(2)
        return base, view

    with pytest.raises(RuntimeError) as eager_error:
        build(True)
    with pytest.raises(RuntimeError) as deferred_error:
        torchdefer.deferred_init(build, True)
    assert str(eager_error.value).split("\n")[0] in str(deferred_error.value)
    eager = build(False)
    got = torchdefer.deferred_init(build, False)
    for g, e in zip(got, eager):
        assert torch.equal(torchdefer.materialize_tensor(g), e)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64, torch.complex64])
@pytest.mark.parametrize("name", ["reshape", "unflatten", "movedim", "expand_as", "contiguous"])
def test_composite_views_in_inference_mode_on_every_dtype_and_device_are_eagers(
    name, dtype, device
):
    # The neighbours of the reshape case: other dtypes, a fake CUDA device
    # (compared with eager on the CPU: the autograd facts do not depend on it),
    # and materialization in both orders.
    def build(on):
        base = torch.ones(2, 3, dtype=dtype, device=on)
        with torch.inference_mode():
            view = COMPOSITE_VIEWS[name](base)
        base.requires_grad_()
        return base, view

    eager = build("cpu")
    for order in ((0, 1), (1, 0)):
        got = torchdefer.deferred_init(build, device)
        assert _view_facts(got[1:], got[0]) == _view_facts(eager[1:], eager[0])
        if device == "cpu":
            real = {i: torchdefer.materialize_tensor(got[i]) for i in order}
            for i in order:
                assert torch.equal(real[i], eager[i])
                assert real[i].requires_grad == eager[i].requires_grad
