"""Row replay of a storage written through a dense view that covers only part of it.

Row replay (the sharded path) computes rows of a parameter from their own
elements. A write through a dense, non-contiguous view from offset 0 (a
transposed view) covers the whole storage only if it has as many elements as
the storage had then; a view of the first part of a bigger storage, or one
taken before ``resize_`` grew it, covers less. Taken for the whole storage,
the write was replayed over rows it never touched (a silent wrong value).
"""

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.distributed._rows import RowReplay
from torchdefer.materialize import Replay


def first_part_transposed():
    w = torch.zeros(30)
    w.fill_(0.5)
    w[:24].view(4, 6).t().fill_(2.0)
    return w


def first_part_transposed_random():
    w = torch.full((40,), 0.25)
    nn.init.xavier_normal_(w[:24].view(4, 6).t())
    return w


def grown_under_a_transposed_view():
    w = torch.zeros(4, 6)
    v = w.t()
    w.resize_(30)
    w.fill_(0.5)
    v.fill_(2.0)
    return w


def grown_then_initialized_through_the_view():
    w = torch.zeros(4, 6)
    v = w.t()
    w.resize_(36)
    w.uniform_()
    v.normal_()
    return w.view(6, 6)


@pytest.mark.parametrize("build", [first_part_transposed, first_part_transposed_random,
                                   grown_under_a_transposed_view,
                                   grown_then_initialized_through_the_view],
                         ids=lambda b: b.__name__)
@pytest.mark.parametrize("rows", [(0, 2), (-6, None), (-2, None)])  # the last ones: past the view
def test_rows_of_a_storage_written_through_part_of_it_match_eager(build, rows):
    a, b = rows
    torch.manual_seed(0)
    eager = build()[a:b].clone()
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(lambda: build()[a:b].clone())
    replay = Replay(lazy._graph, None)
    targets = [(lazy._value, lazy._value.storage.version)]
    got = replay.run(targets, substitute=RowReplay(replay, targets))[0]
    assert torch.equal(got, eager), (got, eager)
