"""How far a ``normal_`` rejection loop moves the CPU generator, in bounded scratch memory.

The loop (``nn.init.trunc_normal_`` since torch 2.12, whenever its bounds can
be reached) draws a whole-tensor ``normal_`` per round and keeps, for each
element, the first value inside ``[lo, hi]``; it ends after the first round in
which no element still waiting was rejected. Element ``i``'s value in round
``k`` depends only on its own words in that round's draw, so the number of
rounds is learnt by drawing each round chunk by chunk into one small buffer
and keeping only the indices still rejected: no tensor of the call's size is
ever held. Later rounds draw only the chunks that hold a waiting index and jump
over the others, and every round ends by a jump of the draw model's word count,
so the result is a generator state, exactly where eager's loop leaves it.

This relies on the CPU fill path of ``normal_`` (16 or more contiguous
elements: Box-Muller blocks of 16 from consecutive uniforms, the last 16
elements made again from the call's last 16 uniforms when the count is not a
multiple of 16; see ``rng.ranges``), checked once per dtype on the installed
torch against a whole ``normal_`` (:func:`chunks_match`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from torchdefer.rng import mt19937

__all__ = ["CHUNK", "NormalRejection", "chunks_match", "normal_rejection_end"]

CHUNK = 1 << 18  # elements drawn at a time (1 MiB of float32)
_BLOCK = 16


def _per_uniform(dtype: torch.dtype) -> int:
    return 2 if dtype == torch.float64 else 1


@dataclass(frozen=True, slots=True)
class NormalRejection:
    """One rejection loop of whole-tensor ``normal_(mean, std)`` rounds on ``n`` contiguous
    elements, keeping each element's first value in ``[lo, hi]`` (bounds in the dtype)."""

    n: int
    dtype: torch.dtype
    mean: float
    std: float
    lo: float
    hi: float
    round_words: int  # words one round's normal_ draws (the draw model's)

    def end(self, state: torch.Tensor) -> torch.Tensor:
        """The generator state after the loop, started from ``state``."""
        return normal_rejection_end(
            state, self.n, self.dtype, self.mean, self.std, self.lo, self.hi, self.round_words
        )

    def rows(
        self, s: int, e: int, out: torch.Tensor, state_at: Callable[[int], torch.Tensor],
        chunk: int | None = None,
    ) -> int:
        """The final values of elements ``[s, e)`` into ``out``; returns elements drawn.

        ``state_at(words)`` is the generator state ``words`` past the loop's first
        word (one jump a round). The first round draws the range straight into
        ``out``, chunk by chunk; later rounds draw only the chunks holding an
        element still rejected, and the rounds stop when every element of the
        range is accepted: a row shard pays its own rounds, not the tensor's.
        """
        waiting: torch.Tensor | None = None
        drawn, first_word = 0, 0
        draw = (self.n, self.dtype, self.mean, self.std, self.round_words, chunk or CHUNK)
        while waiting is None or waiting.numel():
            rejected = []
            for a, values, indices in _round(state_at(first_word), *draw, waiting, s, e):
                drawn += values.numel()
                if indices is None:  # first round: every value in place, rejected or not
                    out[a - s : a - s + values.numel()] = values
                    rejected.append(self._rejected(values).nonzero().reshape(-1) + a)
                    continue
                mine = values[indices - a]
                bad = self._rejected(mine)
                out[indices[~bad] - s] = mine[~bad]
                rejected.append(indices[bad])
            waiting = torch.cat(rejected) if rejected else torch.empty(0, dtype=torch.int64)
            first_word += self.round_words
        return drawn

    def _rejected(self, values: torch.Tensor) -> torch.Tensor:
        return (values < self.lo) | (values > self.hi)

    def _run(self, out: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator(device="cpu")
        generator.set_state(state)
        out.normal_(self.mean, self.std, generator=generator)
        return generator.get_state()


def normal_rejection_end(
    state: torch.Tensor,
    n: int,
    dtype: torch.dtype,
    mean: float,
    std: float,
    lo: float,
    hi: float,
    round_words: int,
    chunk: int | None = None,
) -> torch.Tensor:
    """The CPU generator state after the rejection loop on ``n`` contiguous elements.

    Args:
        state: the generator's state when the loop starts.
        n, dtype: the tensor's size (16 or more, contiguous) and dtype.
        mean, std: the ``normal_`` arguments.
        lo, hi: the bounds as the loop compares them (already in the dtype).
        round_words: words one whole-tensor ``normal_`` draws (the draw model's).
        chunk: elements drawn at a time (a multiple of 16; default :data:`CHUNK`).
    """
    chunk = chunk or CHUNK
    waiting: torch.Tensor | None = None  # sorted indices still rejected; None: all
    while True:
        rejected = []
        for first, values, indices in _round(
            state, n, dtype, mean, std, round_words, chunk, waiting
        ):
            if indices is not None:  # only the waiting elements' values matter
                values = values[indices - first]
            bad = ((values < lo) | (values > hi)).nonzero().reshape(-1)
            rejected.append(bad + first if indices is None else indices[bad])
        state = mt19937.advance(state, round_words)
        waiting = torch.cat(rejected) if rejected else torch.empty(0, dtype=torch.int64)
        if waiting.numel() == 0:
            return state


def _round(state, n, dtype, mean, std, round_words, chunk, waiting, lo=0, hi=None):
    """(first index, values, waiting indices among them) of one round's draw, for the
    elements ``[lo, hi)`` (default: all) from the round's first state ``state``.

    Only chunks holding a waiting index are drawn (all, in the first round,
    where the indices are None). With a remainder, elements ``[n - 16, n)``
    take their final values from the round's last 16 uniforms, not the blocks.
    The values are a reused buffer's: valid until the next item.
    """
    hi = n if hi is None else hi
    per = _per_uniform(dtype)
    whole = n - n % _BLOCK  # elements of whole blocks
    kept = n - _BLOCK if n % _BLOCK else n  # block values that stay final
    generator = torch.Generator(device="cpu")
    buffer = torch.empty(min(chunk, whole), dtype=dtype, device="cpu")
    at = 0  # the word `state` (the generator's position) stands at, from the round's start
    for first in range(lo - lo % _BLOCK, min(kept, hi), chunk):
        size = min(chunk, whole - first)
        a, b = max(first, lo), min(first + size, kept, hi)  # the values wanted
        indices = None if waiting is None else _between(waiting, a, b)
        if indices is not None and indices.numel() == 0:
            continue
        state = mt19937.advance(state, first * per - at)
        generator.set_state(state)
        values = buffer[:size].normal_(mean, std, generator=generator)
        state, at = generator.get_state(), (first + size) * per
        yield a, values[a - first : b - first], indices
    a = max(n - _BLOCK, lo)
    if n % _BLOCK and a < hi:
        indices = None if waiting is None else _between(waiting, a, hi)
        if indices is not None and indices.numel() == 0:
            return
        tail_word = round_words - _BLOCK * per
        generator.set_state(mt19937.advance(state, tail_word - at))
        tail = torch.empty(_BLOCK, dtype=dtype, device="cpu")
        tail.normal_(mean, std, generator=generator)
        yield a, tail[a - (n - _BLOCK) : hi - (n - _BLOCK)], indices


def _between(indices: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The sorted ``indices`` in ``[lo, hi)``."""
    bounds = torch.tensor([lo, hi], dtype=torch.int64, device="cpu")
    a, b = torch.searchsorted(indices, bounds).tolist()
    return indices[a:b]


@functools.cache
def chunks_match(dtype: torch.dtype, words_of: Callable[[int], int | None]) -> bool:
    """Whether drawing a round in chunks gives a whole ``normal_``'s values (checked once).

    ``words_of(n)`` is the draw model's word count of ``normal_`` on ``n``
    contiguous elements of ``dtype``.
    """
    start = torch.Generator(device="cpu").manual_seed(0xC4A2).get_state()
    for n in (16, 50, 64, 83):
        words = words_of(n)
        if words is None:
            return False
        generator = torch.Generator(device="cpu")
        generator.set_state(start)
        whole = torch.empty(n, dtype=dtype, device="cpu").normal_(0.5, 2.0, generator=generator)
        if not torch.equal(generator.get_state(), mt19937.advance(start, words)):
            return False
        pieces = torch.empty(n, dtype=dtype, device="cpu")
        for first, values, _ in _round(start, n, dtype, 0.5, 2.0, words, 32, None):
            pieces[first : first + values.numel()] = values
        if not torch.equal(pieces, whole):
            return False
    return True
