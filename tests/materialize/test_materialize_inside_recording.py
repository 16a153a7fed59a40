"""materialize_tensor / materialize_module called inside deferred_init (issue 24, class 9).

Inside a recording, materializing gives the value so far; a second tensor of
the same storage is rebuilt over the storage the first one made, as outside a
recording, and the real tensors can be used by the code that follows. Eager
code has nothing to refuse there: ``materialize_tensor(x)`` is ``x`` itself.
"""

import itertools

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_tensor, build_both


def _real(t, defer, **kwargs):
    return torchdefer.materialize_tensor(t, **kwargs) if defer else t


def views_materialized_in(order):
    def build(defer):
        a = torch.randn(4, 6)
        views = [a, a[1], a.t(), a[:, ::2], a.view(-1)]
        reals = {i: _real(views[i], defer) for i in order}
        return [reals[i] for i in range(len(views))]

    return build


@pytest.mark.parametrize("order", [[0, 1, 2, 3, 4], [1, 0, 2, 3, 4], [3, 2, 4, 1, 0]])
def test_tensors_sharing_a_storage_materialize_inside_a_recording(order):
    build = views_materialized_in(order)
    eager, lazy = build_both(build, False)[0], build_both(build, True)[1]
    for i, (got, want) in enumerate(zip(lazy, eager, strict=True)):
        assert not torchdefer.is_fake(got)
        assert_same_tensor(got, want, f"view {i}")
    for a, b in itertools.combinations(lazy, 2):
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_materialized_tensors_are_used_by_the_recording_that_follows():
    def build(defer):
        w = torch.randn(3, 5)
        row = _real(w[0], defer)
        whole = _real(w, defer)
        out = torch.zeros(5)
        out.add_(row * 2 + whole.sum(0))
        return out, row.tolist(), whole.t().sum().item()

    eager, lazy = build_both(build, False)[0], build_both(build, True)[1]
    assert_same_tensor(torchdefer.materialize_tensor(lazy[0]), eager[0])
    assert lazy[1:] == eager[1:]


def test_a_conversion_and_a_module_materialize_inside_a_recording():
    def build(defer):
        m = nn.Linear(4, 3)
        half = _real(m.weight, defer, dtype=torch.float64) if defer else m.weight.double()
        tied = nn.Linear(4, 3)
        tied.weight = m.weight
        if defer:
            torchdefer.materialize_module(tied)
        first_row = _real(m.weight[0], defer)
        return half, tied.weight, first_row, m.bias

    torch.manual_seed(0)
    eager = build(False)
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(build, True)
    for i, (got, want) in enumerate(zip(lazy, eager, strict=True)):
        got = torchdefer.materialize_tensor(got)
        assert torch.equal(got.detach(), want.detach()) and got.dtype == want.dtype, i
    assert lazy[2].untyped_storage().data_ptr() == lazy[1].untyped_storage().data_ptr()
