"""The row path with threads: a rank's rows drawn in pieces on threads, bit for bit eager's.

As ``test_rows.py``: rows ``[a, b)`` of a parameter, taken the way sharding
takes them, replayed with the row hook, compared with the eager slice. Here
the rows are cut into pieces on chunk boundaries (chunks made small with
``parallel.min_chunk``) and each piece drawn on a thread; ``drawn`` must
still count the elements drawn, exactly as with one thread.
"""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import torchdefer
from torchdefer.distributed._rows import RowReplay
from torchdefer.materialize import Replay
from torchdefer.materialize import _parallel as parallel
from torchdefer.rng import _chunks as chunks

INITS = {
    "normal": lambda w: w.normal_(0.5, 2.0),
    "uniform": lambda w: w.uniform_(-0.3, 0.7),
    "kaiming": lambda w: nn.init.kaiming_uniform_(w, a=math.sqrt(5)),
    "random": lambda w: w.random_(0, 50),
    "randn": None,  # the creator itself draws
}


def _rows(init: str, shape: tuple[int, int], dtype: torch.dtype, a: int, b: int):
    def build():
        if init == "randn":
            full = torch.randn(shape, dtype=dtype)
        else:
            full = INITS[init](torch.empty(shape, dtype=dtype))
        return full[a:b].clone()  # distribute_tensor(..., Shard(0)): split then clone

    return build


def _with_rows(t: torch.Tensor, threads: int, floor: int) -> tuple[torch.Tensor, RowReplay]:
    replay = Replay(t._graph, None)
    targets = [(t._value, t._value.storage.version)]
    rows = RowReplay(replay, targets)
    with parallel.threads_used(threads), parallel.min_chunk(floor):
        return replay.run(targets, substitute=rows)[0], rows


@settings(max_examples=40, deadline=None)
@given(
    init=st.sampled_from(sorted(INITS)),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
    cols=st.integers(1, 37),
    rows=st.integers(40, 400),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    threads=st.integers(2, 4),
    floor=st.sampled_from([16, 64, 200]),
)
def test_rows_drawn_on_threads_are_eager_rows(init, dtype, cols, rows, cut, threads, floor):
    a, b = sorted(int(c * rows) for c in cut)
    if a == b:
        b = min(rows, a + 1)
    build = _rows(init, (rows, cols), dtype, a, b)
    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    one, rows_one = _with_rows(deferred, 1, floor)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    many, rows_many = _with_rows(deferred, threads, floor)
    assert torch.equal(one, eager) and torch.equal(many, eager)
    assert rows_many.drawn == rows_one.drawn


def test_rows_of_a_large_parameter_split_into_pieces_with_real_jumps(monkeypatch):
    """A 9M-element normal_ parameter, rows [500, 2900) of 3000 (7.2M elements): three
    pieces of at least MIN_CHUNK, their states reached by GF(2) jumps."""
    pieces = []
    real = chunks.ranges.draw_range

    def counting(model, n, total, s, e, out, state_at, run):
        if e - s > 1000:  # not the probe of rng.ranges (tiny pieces)
            pieces.append((s, e))
        return real(model, n, total, s, e, out, state_at, run)

    monkeypatch.setattr(chunks.ranges, "draw_range", counting)
    build = _rows("normal", (3000, 3001), torch.float32, 500, 2900)
    torch.manual_seed(1)
    eager = build()
    torch.manual_seed(1)
    deferred = torchdefer.deferred_init(build)
    got, rows = _with_rows(deferred, 4, chunks.MIN_CHUNK)
    assert torch.equal(got, eager)
    assert len(pieces) == 3 and rows.drawn >= 2400 * 3001
