"""trunc_normal_ on deferred tensors after deferred_init returned (torchtitan: build, then
``model.init_weights()``) is recorded as inside a recording: nothing is materialized."""

import importlib
import warnings

import pytest
import torch
from torch import nn

import torchdefer
from parity import check_program, trunc_normal_reads_data

# The module (the package's `composite` is the decorator).
composite = importlib.import_module("torchdefer.recorder._composite")

needs_loop = pytest.mark.skipif(
    not trunc_normal_reads_data(), reason="before torch 2.12 trunc_normal_ is recorded op by op"
)


class Titan(nn.Module):
    """torchtitan's flow: layers built plain, ``init_weights`` called afterwards."""

    def __init__(self, dim=64, hidden=96, vocab=100):
        super().__init__()
        self.wq = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.small = nn.Parameter(torch.empty(3, 4))
        self.wide = nn.Parameter(torch.empty(8, 12))

    def init_weights(self):
        nn.init.trunc_normal_(self.wq.weight, mean=0.0, std=0.02)  # unreachable bounds
        nn.init.trunc_normal_(self.w1.weight.t(), mean=0.0, std=0.02)  # strided
        cutoff = 64**-0.5
        nn.init.trunc_normal_(self.output.weight, std=cutoff, a=-3 * cutoff, b=3 * cutoff)
        nn.init.trunc_normal_(self.small, std=0.5)  # under 16 elements
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nn.init.trunc_normal_(self.wide, mean=1.0, std=1.0, a=-0.2, b=0.4)  # uniform loop


def _build_then_init(defer):
    model = defer(Titan)
    with torch.no_grad():
        model.init_weights()
    return model, torch.randn(5)  # a draw after: its position must be eager's


@pytest.mark.parametrize("order", ["forward", "reverse", "partial"])
def test_init_after_deferral_matches_eager_in_any_order(order):
    n = len(Titan().state_dict()) + 1
    orders = {"forward": list(range(n)), "reverse": list(range(n))[::-1], "partial": [n - 1, 2]}
    check_program(_build_then_init, order=orders[order])


@needs_loop
def test_init_after_deferral_materializes_nothing_and_records_the_same_nodes(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise AssertionError("a composite ran at the call")

    model = torchdefer.deferred_init(Titan)
    with monkeypatch.context() as m:
        m.setattr(composite.Composite, "__call__", refuse)  # stepped calls never run
        nn.init.trunc_normal_(model.wq.weight, std=0.02)
        cutoff = 64**-0.5
        nn.init.trunc_normal_(model.output.weight, std=cutoff, a=-3 * cutoff, b=3 * cutoff)
        nn.init.trunc_normal_(model.wide, std=1.0, a=-0.2, b=0.2)
    model.init_weights()  # with the calls that are run (on scratch: under 16, strided)
    assert not model.wq.weight._graph.observations  # no mask.any() was materialized
    assert model.wq.weight._value.node.op is torch.ops.aten.normal_.default  # proven
    for t in (model.output.weight, model.small, model.wide):
        assert "trunc_normal" in t._value.node.name


@needs_loop
def test_an_init_after_deferral_with_its_own_generator_leaves_it_where_eager_does():
    def program(defer):
        g = torch.Generator().manual_seed(7)
        w = defer(lambda: torch.empty(40, 9))
        nn.init.trunc_normal_(w, std=1.0, a=-1.0, b=1.0, generator=g)
        nn.init.trunc_normal_(w, std=1.0, a=-0.2, b=0.2, generator=g)
        return w, g

    check_program(program)


def test_is_meta_is_still_false_for_a_deferred_tensor_elsewhere():
    w = torchdefer.deferred_init(lambda: torch.empty(3))
    assert w.is_meta is False
    meta = torch.empty(4, device="meta")
    assert nn.init.trunc_normal_(meta) is meta  # eager's own meta no-op, untouched


def test_a_torch_whose_function_asks_more_first_is_recorded_op_by_op(monkeypatch):
    # Where answering is_meta would not skip torch's whole function, the call is
    # recorded op by op (values right; the masks are materialized).
    monkeypatch.setattr(composite, "_hookable", lambda fn: False)
    check_program(_build_then_init)


def test_a_deferred_meta_tensor_is_left_alone_as_eager_leaves_a_meta_tensor():
    w = torchdefer.deferred_init(lambda: torch.empty(64, 8, device="meta"))
    creator = w._value.node
    torch.manual_seed(0)
    state = torch.get_rng_state()
    assert nn.init.trunc_normal_(w, std=1.0, a=-0.5, b=0.5) is w
    assert torch.equal(torch.get_rng_state(), state)
    if trunc_normal_reads_data():  # before 2.12: pointwise ops, recorded on meta as eager runs them
        assert w._value.node is creator  # nothing recorded
