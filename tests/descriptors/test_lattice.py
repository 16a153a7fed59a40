"""Extraction and widening form a lattice: nothing admitted is ever lost."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdefer
from torchdefer.descriptors import MetaTensorType

DTYPES = [torch.float32, torch.float64, torch.int64]


@st.composite
def tensors(draw, rank=None):
    r = draw(st.integers(0, 3)) if rank is None else rank
    shape = draw(st.lists(st.integers(0, 4), min_size=r, max_size=r))
    t = torch.zeros(shape, dtype=draw(st.sampled_from(DTYPES)))
    return t.requires_grad_() if t.is_floating_point() and draw(st.booleans()) else t


@settings(max_examples=60, deadline=None)
@given(st.lists(tensors(), min_size=1, max_size=5))
def test_from_examples_admits_every_example(examples):
    desc = MetaTensorType.from_examples(*examples)
    assert all(desc.admits(t) for t in examples)


@settings(max_examples=60, deadline=None)
@given(st.lists(tensors(), min_size=1, max_size=6))
def test_widen_never_loses_an_example_already_admitted(examples):
    desc = MetaTensorType.from_examples(examples[0])
    for i, t in enumerate(examples[1:], start=1):
        wider = desc.widen(t)
        assert wider.admits(t)
        assert all(wider.admits(seen) for seen in examples[: i + 1])
        desc = wider


@settings(max_examples=60, deadline=None)
@given(tensors(), st.lists(tensors(), max_size=4))
def test_widen_is_identity_on_admitted_tensors_and_keeps_ranges_covering(first, rest):
    desc = MetaTensorType(["n"] * first.dim(), dim_ranges={"n": (1, 2)})
    for t in [first, *rest]:
        desc = desc.widen(t)
        assert desc.widen(t) == desc
        assert desc.admits(t)


def test_from_examples_keeps_equal_dims_and_shares_dims_that_vary_together():
    d = MetaTensorType.from_examples(torch.zeros(2, 2, 5), torch.zeros(3, 3, 5))
    assert d.shape == ("d0", "d0", 5)
    assert d.dtype == torch.float32 and d.device == torch.device("cpu")
    assert not d.admits(torch.zeros(2, 3, 5))


def test_widen_splits_a_symbol_bound_inconsistently_and_relaxes_dtype():
    d = MetaTensorType(["n", "n"], torch.float32).widen(torch.zeros(2, 3, dtype=torch.int64))
    assert d.shape == ("n", "w0")
    assert d.dtype is None
    assert d.admits(torch.zeros(4, 4)) and d.admits(torch.zeros(2, 3, dtype=torch.int64))


def test_widen_to_another_rank_forgets_the_shape():
    d = MetaTensorType([2, 3], torch.float32).widen(torch.zeros(2))
    assert d.shape is None and d.rank is None and d.dtype == torch.float32


def test_describe_shares_symbols_across_arguments_and_keeps_equal_values():
    def f(x, mask, n, flag):
        return x

    calls = [
        (torch.zeros(2, 8), torch.ones(2, dtype=torch.bool), 1, True),
        {"x": torch.zeros(5, 8), "mask": torch.ones(5, dtype=torch.bool), "n": 4, "flag": True},
    ]
    d = torchdefer.describe(f, *calls)
    assert d["x"].shape == ("d0", 8) and d["mask"].shape == ("d0",)
    assert d["n"] is int and d["flag"] is True
    p = torchdefer.script(f, d)
    x = torch.randn(3, 8)
    torch.testing.assert_close(p(x, torch.ones(3, dtype=torch.bool), 7, True), x)
