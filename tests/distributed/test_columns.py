"""Column blocks (``Shard(1)``, as RowwiseParallel records them) come from chunks of rows.

In one process: a deferred parameter, a recorded ``[:, c0:c1].clone()`` (what
``distribute_tensor`` records for ``Shard(1)``) and, for TP+FSDP2, a row range
of that clone; each is replayed by ``shard.replay_local`` and compared bit for
bit with the same slicing of the eager tensor, and the path is checked.
The multi-rank layouts are in ``test_parallel_layouts.py``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.distributed import _columns as columns
from torchdefer.distributed._columns import block_of_rows
from torchdefer.distributed.shard import observe, replay_local
from torchdefer.recorder._graph import TensorMeta

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="needs torch.distributed"
)


def _titan_like(rows: int, cols: int, dtype=torch.float32) -> torch.Tensor:
    weight = torch.empty(rows, cols, dtype=dtype)
    nn.init.trunc_normal_(weight, std=0.02)  # default bounds: one normal_, by proof
    return weight.mul_(2.0)


INITS = {
    "trunc_normal_": _titan_like,
    "kaiming_uniform_": lambda r, c: nn.Linear(c, r, bias=False).weight.detach(),
    "randn then scale": lambda r, c: torch.randn(r, c) * 0.5,
    "bfloat16 normal_": lambda r, c: torch.empty(r, c, dtype=torch.bfloat16).normal_(0, 0.02),
}


def _both(build, slicer):
    torch.manual_seed(0)
    eager = slicer(build())
    after = torch.randn(3)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(lambda: slicer(build()))
    with observe() as seen:
        real = replay_local([deferred], "weight")[0]
    assert torch.equal(torch.randn(3), after), "materialization moved the generator"
    return eager, real, seen[0]


@pytest.mark.parametrize("init", INITS)
@pytest.mark.parametrize("chunk", [64, columns.CHUNK_BYTES])
def test_a_column_block_is_computed_from_row_chunks_bit_for_bit(init, chunk, monkeypatch):
    monkeypatch.setattr(columns, "CHUNK_BYTES", chunk)  # 64 bytes: one row per chunk

    def slicer(w):
        return w[:, 7:20].clone()  # Shard(1) of 4 over 37 columns, as torch.chunk cuts it

    eager, real, seen = _both(lambda: INITS[init](29, 37), slicer)
    assert torch.equal(real, eager) and real.dtype == eager.dtype
    assert seen.rows and seen.chunked, seen
    assert real.untyped_storage().nbytes() == eager.numel() * eager.element_size()


@pytest.mark.parametrize("rows", [(0, 10), (10, 29), (3, 4), (28, 29)])
def test_a_row_range_of_a_column_block_draws_only_those_rows(rows, monkeypatch):
    """TP+FSDP2: FSDP2 shards the RowwiseParallel block on dim 0."""
    monkeypatch.setattr(columns, "CHUNK_BYTES", 4 * 37 * 4)  # four rows per chunk
    a, b = rows

    def slicer(w):
        return w[:, 19:37].clone()[a:b].clone()

    eager, real, seen = _both(lambda: _titan_like(29, 37), slicer)
    assert torch.equal(real, eager)
    assert seen.rows and seen.chunked, seen
    # whole rows of the parameter, a Box-Muller block beyond at most at either end
    assert seen.drawn <= (b - a) * 37 + 3 * 16, seen.drawn


def test_a_conv_weight_sharded_on_input_channels_merges_its_inner_dims():
    def slicer(w):
        return w[:, 4:8].clone()

    eager, real, seen = _both(lambda: nn.Conv2d(12, 6, 3).weight.detach(), slicer)
    assert torch.equal(real, eager) and seen.chunked


def test_an_init_that_mixes_elements_still_builds_the_parameter_whole_and_right():
    def build():
        return nn.init.orthogonal_(torch.empty(12, 10))

    eager, real, seen = _both(build, lambda w: w[:, 5:].clone())
    assert torch.equal(real, eager)
    # the reason is the op of the parameter's init (orthogonal_'s copy_), not the slicing
    assert not seen.rows and " in build:" in seen.reason, seen


def test_a_write_to_the_block_after_the_clone_falls_back_and_stays_right():
    def slicer(w):
        block = w[:, 2:6].clone()
        block[0].zero_()
        return block

    eager, real, seen = _both(lambda: torch.randn(9, 8), slicer)
    assert torch.equal(real, eager)


def test_a_block_read_as_another_dtype_falls_back_and_stays_right():
    def slicer(w):
        return w[:, 2:6].to(torch.float64)

    eager, real, _ = _both(lambda: torch.randn(9, 8), slicer)
    assert torch.equal(real, eager) and real.dtype == torch.float64


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (lambda t: t[:, 2:5], (6, 3, 8, 2)),
        (lambda t: t[1:4, 3:], (3, 5, 8, 11)),
        (lambda t: t.view(6, 2, 4)[:, 1], (6, 4, 8, 4)),  # the second half of each row
        (lambda t: t[:, :], None),  # contiguous: plain row replay
        (lambda t: t.t(), None),  # transposed: not runs in row-major order
        (lambda t: t[::2, ::2], None),  # steps within a row
        (lambda t: t[:1, 2:5], None),  # one run: contiguous
    ],
)
def test_block_of_rows_recognizes_exactly_runs_of_consecutive_elements(view, expected):
    base = torch.empty(6, 8)
    v = view(base)
    assert block_of_rows(TensorMeta.of(v, v.device)) == expected


@pytest.mark.parametrize("elements", [(5, 40), (13, 26), (14, 20), (0, 1), (376, 377)])
def test_a_range_cutting_rows_of_the_block_is_computed_bit_for_bit(elements, monkeypatch):
    monkeypatch.setattr(columns, "CHUNK_BYTES", 3 * 37 * 4)  # three rows per chunk
    a, b = elements

    def slicer(w):
        return w[:, 7:20].clone().view(-1)[a:b].clone()  # 13 columns: 377 elements

    eager, real, seen = _both(lambda: _titan_like(29, 37), slicer)
    assert torch.equal(real, eager) and seen.chunked
