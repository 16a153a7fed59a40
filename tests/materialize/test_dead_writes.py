"""Writes that later writes hide are not replayed, and values stay eager's.

A write is dead when every byte it wrote is set again by writes that do not
read it (``materialize._overwrites``): a whole overwrite, or several partial
ones that cover it together (``dcp.load``'s copies, one per saved chunk). A
write that reads the storage in between keeps what it reads alive. Each case
compares with eager and looks at which nodes the plan keeps.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdefer
from parity import build_both
from torchdefer.materialize._cache import cache_for
from torchdefer.materialize._plan import make_plan
from torchdefer.recorder._graph import NodeKind

A = torch.arange(6.0).reshape(2, 3)
B = -torch.arange(6.0).reshape(2, 3)


def _random(t: torch.Tensor) -> list[str]:
    """The random nodes replay would run for deferred ``t``."""
    plan = make_plan([(t._value, t._value.storage.version)], cache_for(t._graph),
                     "recorded", None)
    skipped = plan.passthrough | plan.allocate  # allocate: a factory only allocates
    return [node.name for node in plan.nodes
            if node.kind == NodeKind.RANDOM and id(node) not in skipped]


def _check(build, dead: bool):
    """Eager parity of every output; whether the first output's random init is planned."""
    eager, deferred = build_both(build)
    rng_after = torch.get_rng_state()
    torch.manual_seed(0)
    build()
    assert torch.equal(rng_after, torch.get_rng_state()), "the generator ends elsewhere"
    outs = deferred if isinstance(deferred, tuple) else (deferred,)
    refs = eager if isinstance(eager, tuple) else (eager,)
    randoms = _random(outs[0])
    assert (not randoms) == dead, randoms
    for out, ref in zip(outs, refs):
        real = torchdefer.materialize_tensor(out)
        assert torch.equal(real, ref) and real.stride() == ref.stride()
    assert torch.equal(rng_after, torch.get_rng_state()), "materializing moved the generator"


def test_partial_copies_that_cover_a_tensor_make_its_init_dead():
    def build():
        w = torch.empty(4, 3)
        nn.init.kaiming_uniform_(w)
        w[:2].copy_(A)
        w[2:].copy_(B)
        return w

    _check(build, dead=True)


def test_copies_in_any_order_and_overlapping_still_cover():
    def build():
        w = torch.empty(4, 3)
        w.normal_()
        w[1:3].copy_(A)
        w[2:].copy_(B)
        w[:2].fill_(5.0)
        return w

    _check(build, dead=True)


def test_a_write_reading_the_tensor_between_keeps_the_init_alive():
    def build():
        w = torch.empty(4, 3).normal_()
        w[:2].fill_(1.0)
        w.mul_(2)
        w[2:].fill_(3.0)
        return w

    _check(build, dead=False)


def test_a_copy_from_the_same_storage_reads_the_init():
    def build():
        w = torch.randn(4, 3)
        w[:2].copy_(w[2:])
        w[2:].fill_(0.0)
        return w

    _check(build, dead=False)


def test_a_partial_cover_leaves_the_init_alive():
    def build():
        w = torch.empty(4, 3).uniform_()
        w[:3].copy_(torch.ones(3, 3))
        return w

    _check(build, dead=False)


def test_column_blocks_that_cover_a_tensor_make_its_init_dead():
    # dcp.load of a column-sharded checkpoint into a row shard writes w[:, a:b]
    def build():
        w = torch.empty(4, 3).normal_()
        w[:, 0].fill_(1.0)
        w[:, 1:].copy_(torch.ones(4, 2))
        return w

    _check(build, dead=True)


def test_strided_writes_that_leave_elements_keep_the_init():
    def build():
        w = torch.randn(4, 6)
        w[:, ::2].fill_(1.0)
        w[::2, 1::2].fill_(2.0)
        return w

    _check(build, dead=False)


def test_a_row_of_an_expanded_view_covers_its_bytes():
    def build():
        w = torch.randn(3)
        w.view(1, 3).expand(2, 3)[0].fill_(1.0)  # a plain row after all
        return w

    _check(build, dead=True)


def test_a_write_through_a_view_of_another_dtype_covers_the_bytes():
    def build():
        w = torch.empty(4).normal_()
        w.view(torch.int32).zero_()
        return w

    _check(build, dead=True)


def test_a_random_factory_whose_elements_are_all_overwritten_only_allocates():
    def build():
        p = nn.Parameter(torch.randn(4, 3))
        with torch.no_grad():
            p[:2].copy_(A)
            p[2:].copy_(B)
        return p, torch.randn(2)  # the draw after keeps its position

    _check(build, dead=True)


def test_a_view_taken_before_the_overwrite_reads_the_new_values():
    def build():
        w = torch.randn(4, 3)
        v = w[1:3]
        w.copy_(torch.cat([A, B]))
        return v, w

    _check(build, dead=True)


def test_new_zeros_does_not_replay_the_tensor_it_takes_its_dtype_from():
    def build():
        p = torch.randn(100, 10, dtype=torch.float64)
        return p.new_zeros(3), p[:2].new_ones(2, 2)

    eager, (zeros, ones) = build_both(build)
    for t, ref in ((zeros, eager[0]), (ones, eager[1])):
        assert not _random(t)
        real = torchdefer.materialize_tensor(t)
        assert torch.equal(real, ref) and real.dtype == torch.float64


def test_a_grown_storage_keeps_the_writes_before_the_growth():
    def build():
        t = torch.zeros(2)
        t.normal_()
        t.resize_(4)
        t[:2].fill_(1.0)
        t[2:].fill_(2.0)
        return t

    _check(build, dead=False)


@pytest.mark.parametrize("bounds", [(-2.0, 2.0), (-0.5, 0.5)], ids=["proven", "rejection loop"])
def test_later_draws_keep_their_positions_past_a_dead_init(bounds):
    # A dead trunc_normal_ (a rejection loop when its bounds are reachable) is
    # skipped; the randn after it still starts where eager's did.
    def build():
        w = torch.empty(64)
        nn.init.trunc_normal_(w, a=bounds[0], b=bounds[1])
        w.fill_(0.5)
        return torch.randn(5), w

    eager, (later, w) = build_both(build)
    assert not _random(w)
    assert torch.equal(torchdefer.materialize_tensor(later), eager[0])
    assert torch.equal(torchdefer.materialize_tensor(w), eager[1])
