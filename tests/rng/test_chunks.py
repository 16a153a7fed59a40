"""Chunk geometry of rng.chunks, and the state a chunked call leaves, against eager."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from torchdefer.rng import _chunks as chunks
from torchdefer.rng import mt19937
from torchdefer.rng._ranges import BLOCK, ElementModel


@settings(max_examples=300, deadline=None)
@example(n=8113, blocks=True, words=1, threads=14, floor=1, lead=0)
@given(
    n=st.integers(0, 10**7),
    blocks=st.booleans(),
    words=st.sampled_from([1, 2]),
    threads=st.integers(1, 64),
    floor=st.integers(1, 10**6),
    lead=st.sampled_from([0, 1, 1000, chunks.LEAD, 10**7]),
)
def test_chunks_start_on_whole_refills_and_whole_blocks(n, blocks, words, threads, floor, lead):
    starts = chunks.bounds(n, ElementModel(blocks, words), threads, floor, lead)
    assert starts[0] == 0 and starts[-1] == n
    assert starts == sorted(set(starts)) or starts == [0, 0]
    assert len(starts) - 1 <= max(threads, 1)
    if len(starts) > 2:
        for s in starts[1:-1]:
            assert (s * words) % mt19937.N == 0
            assert not blocks or s % BLOCK == 0
            assert s >= floor
        if blocks:
            assert n - starts[-2] >= BLOCK  # the tail rule stays in the last chunk
        sizes = [e - s for s, e in itertools.pairwise(starts)]
        # The first chunk (no jump) is the largest: by at most the lead and a step.
        # The last may exceed it by a tail of under one block, which the tail rule
        # keeps in the last chunk (n=8113 on 14 threads: 12 x 624 and 625).
        step = mt19937.N // math.gcd(mt19937.N, words) * (BLOCK if blocks else 1)
        assert sizes[0] >= max(sizes[1:-1], default=0)
        assert sizes[-1] <= sizes[0] + (BLOCK - 1 if blocks else 0)
        if len(sizes) > 2:  # the last chunk may be a remainder
            assert sizes[0] - sizes[1] <= lead + step
        assert starts == chunks.bounds(n, ElementModel(blocks, words), threads, floor, lead)


def test_the_first_chunk_draws_the_lead_more_than_the_others():
    n = 16 * chunks.MIN_CHUNK
    starts = chunks.bounds(n, ElementModel(True, 1), 2, chunks.MIN_CHUNK, chunks.LEAD)
    assert len(starts) == 3
    first, second = starts[1], n - starts[1]
    assert 0 < first - second - chunks.LEAD <= 2 * 624 * BLOCK


@pytest.mark.parametrize(
    "dtype,op,n",
    [
        (torch.float32, "normal_", 9_000_001),
        (torch.bfloat16, "normal_", 9_000_007),
        (torch.float64, "uniform_", 4_500_003),
        (torch.int64, "random_", 5_000_001),
    ],
)
def test_a_chunked_call_leaves_the_state_the_whole_call_leaves(dtype, op, n):
    g = torch.Generator().manual_seed(12)
    torch.empty(5, dtype=torch.float64).normal_(generator=g)  # a cached normal too
    start = g.get_state()
    whole = getattr(torch.empty(n, dtype=dtype), op)(generator=g)
    end = g.get_state()

    def run(view, state):
        private = torch.Generator()
        private.set_state(state)
        getattr(view, op)(generator=private)
        return private.get_state()

    # Words an element: float64 uniforms and full-range int64 take 64 bits.
    model = ElementModel(op == "normal_", 2 if dtype.itemsize == 8 else 1)
    starts = chunks.bounds(n, model, 4, 1 << 20)
    assert len(starts) == 5
    out = torch.empty(n, dtype=dtype)
    after = chunks.draw_chunks(model, out, start, run, starts)
    assert torch.equal(out, whole)
    assert torch.equal(after, end)


def test_advance_jumps_short_distances_once_their_power_is_known():
    g = torch.Generator().manual_seed(1)
    torch.empty(100, dtype=torch.int32).random_(generator=g)
    state = g.get_state()
    words = 3 * mt19937.N * 1000 + 17
    drawn = mt19937._draw(state, words)
    assert torch.equal(mt19937.advance(state, words), drawn)  # drawn: power not known
    blocks = (mt19937.N - mt19937.words_left_in_block(state) + words - 1) // mt19937.N
    mt19937._warm.add(blocks)
    try:
        assert torch.equal(mt19937.advance(state, words), drawn)  # jumped
    finally:
        mt19937._warm.discard(blocks)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 10**6), cached=st.booleans(), threads=st.integers(1, 16),
       floor=st.integers(1, 10**5))
def test_pair_chunks_start_after_whole_pairs_on_whole_refills(n, cached, threads, floor):
    starts = chunks.pair_bounds(n, cached, threads, floor)
    assert starts[0] == 0 and starts[-1] == n and len(starts) - 1 <= max(threads, 1)
    for s in starts[1:-1]:
        assert (s - cached) % 2 == 0
        assert (chunks.PAIR_WORDS * (s - cached) // 2) % mt19937.N == 0


@pytest.mark.parametrize("cached", [0, 1])
def test_a_chunked_log_normal_leaves_the_state_and_cache_the_whole_call_leaves(cached):
    g = torch.Generator().manual_seed(5)
    torch.empty(cached, dtype=torch.float64).normal_(generator=g)
    start = g.get_state()
    n = 5_000_001
    whole = torch.empty(n).log_normal_(0.1, 0.3, generator=g)
    end = g.get_state()

    def run(view, state):
        private = torch.Generator()
        private.set_state(state)
        view.log_normal_(0.1, 0.3, generator=private)
        return private.get_state()

    starts = chunks.pair_bounds(n, bool(cached), 4, 1 << 20)
    assert len(starts) == 5
    out = torch.empty(n)
    after = chunks.draw_pairs(out, start, run, starts)
    assert torch.equal(out, whole) and torch.equal(after, end)


def test_a_failing_chunk_is_raised_after_every_chunk_ended():
    from torchdefer.rng._workers import run_pieces

    ended = []

    def piece(k):
        def run():
            if k == 1:
                raise RuntimeError("chunk 1")
            import time

            time.sleep(0.05)
            ended.append(k)
            return k

        return run

    with pytest.raises(RuntimeError, match="chunk 1"):
        run_pieces([piece(k) for k in range(4)])
    assert sorted(ended) == [0, 2, 3]
    assert run_pieces([piece(0), piece(2)]) == [0, 2]


def test_a_forked_child_forgets_the_kept_draw_threads():
    """Threads are not copied into a fork: the child must start its own, or its
    pieces would wait on threads that do not exist."""
    from torchdefer.rng import _workers

    workers = _workers._Workers()
    parent = workers.pool(2)
    assert workers.pool(1) is parent and workers.pool(2) is parent
    workers.forget()  # what os.register_at_fork runs in the child
    child = workers.pool(1)
    assert child is not parent and child.submit(lambda: 7).result() == 7
    parent.shutdown()
    child.shutdown()
