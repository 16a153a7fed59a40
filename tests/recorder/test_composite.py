"""Data-dependent init functions are recorded as one node and replayed by calling them."""

import psutil
import torch
from torch import nn

import torchdefer
from parity import assert_same_tensor, check_module_parity, check_program, trunc_normal_reads_data
from torchdefer.recorder import NodeKind


class TitanBlock(nn.Module):
    """torchtitan-style: trunc_normal_ everywhere, applied in __init__."""

    def __init__(self, dim=64, hidden=176):
        super().__init__()
        self.wq = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.norm = nn.LayerNorm(dim)
        for i, linear in enumerate((self.wq, self.w1, self.w2)):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02 * (i + 1))
        g = torch.Generator().manual_seed(3)
        self.extra = nn.Parameter(torch.empty(5, 7))
        nn.init.trunc_normal_(self.extra, std=1.0, a=-0.5, b=0.5, generator=g)  # p < 0.3 branch


def test_trunc_normal_models_match_eager_bit_for_bit():
    check_module_parity(lambda: nn.Sequential(TitanBlock(), TitanBlock()))


def test_trunc_normal_is_one_node_and_recording_reads_no_data():
    m = torchdefer.deferred_init(TitanBlock)
    node = m.extra._value.node  # bounds within half a sigma: data-dependent
    if trunc_normal_reads_data():  # torch >= 2.12: a rejection loop, one composite node
        assert node.kind == NodeKind.RANDOM
        assert "trunc_normal" in node.name
        # Bounds normal_ cannot reach: the loop is its one normal_ (test_trunc_normal.py).
        assert m.wq.weight._value.node.op is torch.ops.aten.normal_.default
    else:  # before: erfinv of a uniform, recorded op by op; the last is clamp_
        assert node.kind == NodeKind.INPLACE
        assert "clamp" in node.name
    assert not m.wq.weight._graph.observations  # nothing was materialized to record it


def test_recording_trunc_normal_allocates_nothing_for_the_weights():
    process = psutil.Process()
    before = process.memory_info().rss
    with torchdefer.deferred():
        w = nn.Parameter(torch.empty(8192, 8192))  # 256 MiB if it were real
        nn.init.trunc_normal_(w, std=0.02)
        recording = process.memory_info().rss - before
    # Default bounds no normal_ can reach: recorded as its one normal_, and
    # leaving the block is a jump (test_trunc_normal.py covers the data-dependent
    # calls, whose draws are stepped in bounded chunks).
    after = process.memory_info().rss - before
    assert recording < 64 << 20
    assert after < 64 << 20
    assert torchdefer.is_deferred(w)


def test_materializing_after_a_composite_in_any_order_matches_eager():
    def build():
        a = torch.empty(300)
        nn.init.trunc_normal_(a)
        return a, torch.randn(40), torch.rand(7)

    check_program(lambda defer: defer(build), order=[2, 0, 1])


def test_users_mark_their_own_data_dependent_init_functions():
    @torchdefer.composite
    def clipped_normal_(t, limit=1.5):
        t.normal_()
        while bool((t.abs() > limit).any()):
            t.copy_(torch.where(t.abs() > limit, torch.randn_like(t), t))
        return t

    def build():
        return clipped_normal_(torch.empty(50, 4)), torch.randn(3)

    torch.manual_seed(0)
    ref = build()
    torch.manual_seed(0)
    got = torchdefer.deferred_init(build)
    assert not got[0]._graph.observations
    for r, g in zip(ref, got, strict=True):
        assert_same_tensor(torchdefer.materialize_tensor(g), r)
    # On real tensors the function runs as it is.
    torch.manual_seed(0)
    assert torch.equal(clipped_normal_(torch.empty(50, 4)), ref[0])


def test_the_library_function_is_restored_after_recording():
    original = torch.nn.init._no_grad_trunc_normal_
    torchdefer.deferred_init(TitanBlock)
    assert torch.nn.init._no_grad_trunc_normal_ is original


def test_a_composite_reading_through_one_argument_what_it_writes_through_another():
    # Run into scratch to learn its draws, its arguments must share storage as
    # eager's did: separate copies ended it after one draw, a silently different
    # generator for everything after it.
    @torchdefer.composite(writes=(0,))
    def redraw(t, head):
        t.normal_()
        k = 0
        while bool(head[0] > 0.0) and k < 6:  # reads what t.normal_() wrote
            t.normal_()
            k += 1
        return t

    def program(defer):
        def build():
            t = torch.zeros(8)
            redraw(t, t[:2])
            return t, torch.randn(3)

        return defer(build)

    check_program(program, order=[1, 0])  # the draw after it first: from the composite's end
