"""One random call drawn in chunks, each on its own thread from its own jumped state.

PyTorch's CPU generator is one serial stream, so an eager ``normal_`` of a
billion elements runs on one core. Where a call's elements take their words
at fixed places (``rng._ranges``: per element, or Box-Muller blocks of 16),
elements ``[s, e)`` can be drawn from the state ``words * s`` words on,
reached by jump-ahead (``mt19937.advance``), independently of the others:

* **per element** (``uniform_``, ``random_``, ``bernoulli_(p)``,
  ``exponential_`` ... where the measured model says ``a`` words an element
  and nothing else): any element is a boundary;
* **Box-Muller blocks** (``normal_``/``randn`` on 16 or more contiguous
  elements): a chunk starts at a multiple of 16, so its blocks are the call's
  blocks, and the last chunk keeps the tail rule (the last 16 elements made
  again from the call's last 16 uniforms) by running exactly as the call's
  end does; it always has 16 elements or more.

Chunk starts are also multiples of 624 words (one mt19937 refill): the jump
polynomial then depends only on the distance, not on where in its refill the
call starts, so tensors of one shape share their jumps' powers of ``x``
(``gf2`` caches them) and a jump costs ~2 ms instead of ~20.

* **cached normals** (``log_normal_``): a sample takes the generator's cached
  normal or draws a pair (four words) and caches the second; a chunk starts
  after a whole pair (:func:`pair_bounds`, :func:`draw_pairs`).

Calls that do not split run whole: strided outputs (the kernel walks them
in TensorIterator's order, not storage order, so a run of that order is no
view; strided ``normal_`` also takes cached normals in pairs along it),
``bernoulli_`` with MKL (one seed word for the whole call), rejection loops
(``rng._rejection``: where a round starts is known only once the rounds
before it were drawn) and other composites whose draws depend on values,
``randperm``, and anything the draw model does not know.

The first chunk starts from the call's own state and the others jump first,
so the first takes :data:`LEAD` elements more (``bounds(..., lead=)``).

The last chunk's end state is the call's end state: the generator is left
where one eager call leaves it.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

import torch

from torchdefer.errors import InternalError
from torchdefer.rng import _ranges as ranges
from torchdefer.rng import mt19937
from torchdefer.rng._ranges import BLOCK, ElementModel
from torchdefer.rng._workers import run_pieces

__all__ = ["LEAD", "MIN_CHUNK", "PAIR_WORDS", "bounds", "draw_chunks", "draw_pairs", "draw_range",
           "pair_bounds"]

# Elements per chunk, at least: a chunk costs a jump (~2 ms with its power of
# x known, 5-40 ms for a new one) and a thread; float32 normal_ draws ~2.5 ns
# an element on one idle core here, so a 2M-element chunk (~5 ms) more than
# pays for a known jump (bench/results/parallel.md measures the threshold).
MIN_CHUNK = 1 << 21
# Elements the first chunk draws beyond the others: it starts from the call's
# own state, while each other chunk first jumps to its start (~2 ms with the
# power of x known: ~500k float32 normal_ elements with page faults, at ~4 ns).
# Equal chunks would leave the first chunk's core idle for a jump per call.
# A constant, not a timing: chunk starts then depend only on the call's size,
# so calls of one shape keep sharing their powers of x.
LEAD = 1 << 19

Runner = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def bounds(n: int, model: ElementModel, threads: int, min_chunk: int = MIN_CHUNK,
           lead: int = 0) -> list[int]:
    """Chunk starts of a call of ``n`` elements, then ``n``: ``[0, c1, c2, ..., n]``.

    At most ``threads`` chunks of at least ``min_chunk`` elements each; one
    chunk (``[0, n]``) where splitting cannot pay or is not safe. The first
    chunk takes up to ``lead`` elements more than the others (it needs no jump).
    """
    step = _alignment(model)
    parts = min(threads, n // max(min_chunk, 1))
    if parts < 2 or n < 2 * max(step, BLOCK):
        return [0, n]
    lead = min(lead, n // parts)  # never more than doubles the first chunk
    size = _up(-(-(n - lead) // parts), step)  # ceil, whole steps
    first = _up(lead + size, step)
    starts = [0, *range(first, n, size)]
    if model.blocks and n - starts[-1] < BLOCK:
        starts.pop()  # the tail rule needs 16 elements in the last chunk
    return [*starts, n]


def _up(x: int, step: int) -> int:
    return -(-x // step) * step


def _alignment(model: ElementModel) -> int:
    """Elements between chunk starts: whole refills of words (and whole blocks)."""
    per_refill = mt19937.N // math.gcd(mt19937.N, model.words)
    return math.lcm(per_refill, BLOCK) if model.blocks else per_refill


def _cuts(s: int, e: int, model: ElementModel, threads: int, min_chunk: int,
          lead: int) -> list[int]:
    """``[s, c1, ..., e]``: the inner cuts of a range on chunk boundaries of the call."""
    inner = [s + c for c in bounds(e - s, model, threads, min_chunk, lead)[1:-1]]
    step = _alignment(model)
    cuts = sorted({-(-c // step) * step for c in inner} - {s, e})
    return [s, *(c for c in cuts if s < c < e), e]


def draw_chunks(
    model: ElementModel,
    out: torch.Tensor,
    state: torch.Tensor,
    run: Runner,
    starts: list[int],
) -> torch.Tensor:
    """Draw a whole call into the 1-D contiguous ``out`` from ``state``, chunk by chunk.

    ``starts`` comes from :func:`bounds`; ``run(view, state)`` draws the call
    at ``view``'s length into it and returns the state after. Chunk ``k``
    jumps to its first word and draws on a thread of its own; intra-op
    parallelism is off meanwhile (the chunks are the parallelism, and the
    fill kernels are serial). Returns the state after the last chunk: where
    the call drawn whole leaves the generator.
    """
    def state_for(s: int) -> torch.Tensor:
        return mt19937.advance(state, model.words * s, recurring=True)

    return _threaded(out, state, starts, state_for, run)


def pair_bounds(n: int, cached: bool, threads: int, min_chunk: int = MIN_CHUNK) -> list[int]:
    """Chunk starts of ``n`` cached-normal samples (``log_normal_``), then ``n``.

    Each sample of ``at::normal_distribution<double>`` takes the generator's
    cached normal if it has one, else draws a pair (two 64-bit uniforms, four
    words), returns the first and caches the second. A chunk starts right
    after a whole pair (the first sample takes a cached normal if ``cached``),
    at whole refills of words from the call's start.
    """
    step = 2 * (mt19937.N // math.gcd(mt19937.N, PAIR_WORDS))  # samples per whole refills
    parts = min(threads, n // max(min_chunk, 1))
    if parts < 2 or n < 2 * step + 1:
        return [0, n]
    per_part = -(-n // parts)  # ceil
    size = -(-per_part // step) * step
    first = int(cached)
    starts = [0, *(first + k * size for k in range(1, parts) if first + k * size < n)]
    return [*starts, n]


PAIR_WORDS = 4  # words of one pair of cached-normal samples


def draw_pairs(out: torch.Tensor, state: torch.Tensor, run: Runner,
               starts: list[int]) -> torch.Tensor:
    """A cached-normal call into the 1-D contiguous ``out``, chunk by chunk (see
    :func:`pair_bounds`); returns the state the call drawn whole leaves."""
    first = int(mt19937.cache_valid(state))

    def state_for(s: int) -> torch.Tensor:
        # Eager reaches sample s with the cached normal just taken: none cached.
        moved = mt19937.advance(state, PAIR_WORDS * (s - first) // 2, recurring=True)
        return mt19937.without_cached_normal(moved)

    return _threaded(out, state, starts, state_for, run)


def _threaded(out: torch.Tensor, state: torch.Tensor, starts: list[int],
              state_for: Callable[[int], torch.Tensor], run: Runner) -> torch.Tensor:
    """Chunk ``[s, e)`` of ``starts`` drawn by ``run`` from ``state_for(s)`` (the first
    from ``state``), each on a thread; the state after the last chunk."""
    pieces = list(itertools.pairwise(starts))
    if len(pieces) == 1:
        return run(out, state)
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def chunk(s: int, e: int) -> torch.Tensor:
        # Grad and inference mode are per thread: the caller's hold here too.
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            return run(out[s:e], state if s == 0 else state_for(s))

    with mt19937.one_thread():
        ends = run_pieces([functools.partial(chunk, s, e) for s, e in pieces])
    return ends[-1]


def draw_range(
    model: ElementModel,
    n: int,
    total_words: int,
    s: int,
    e: int,
    out: torch.Tensor,
    state_at: Callable[[int], torch.Tensor],
    run: Runner,
    threads: int,
    min_chunk: int = MIN_CHUNK,
    lead: int = 0,
) -> None:
    """:func:`ranges.draw_range` (elements ``[s, e)`` of a call of ``n``) on ``threads``.

    A sharded rank's rows are one range; it is cut on the call's chunk
    boundaries and each piece drawn on a thread of its own. ``state_at`` is
    asked once, here (it may read shared accounting); the threads jump on
    from the state it gives. ``run`` is called from several threads. The first
    piece (a jump of less than a refill) takes up to ``lead`` elements more.
    """
    cuts = _cuts(s, e, model, threads, min_chunk, lead)
    if len(cuts) < 3:
        ranges.draw_range(model, n, total_words, s, e, out, state_at, run)
        return
    step = _alignment(model)
    w0 = model.words * (s // step * step)  # every word a piece asks for is past it
    base = state_at(w0)
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def jumped(word: int) -> torch.Tensor:
        if word < w0:
            raise InternalError(f"chunks.draw_range: word {word} asked for, before the "
                                f"range's first word {w0}")
        return mt19937.advance(base, word - w0, recurring=True)

    def piece(a: int, b: int) -> None:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            ranges.draw_range(model, n, total_words, a, b, out[a - s : b - s], jumped, run)

    pieces = list(itertools.pairwise(cuts))
    with mt19937.one_thread():
        run_pieces([functools.partial(piece, a, b) for a, b in pieces])
