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

Each round takes one of ``normal_``'s two CPU paths, and the loop knows which:
the fill path (16 or more contiguous elements: Box-Muller blocks of 16 from
consecutive uniforms, the last 16 elements made again from the call's last 16
uniforms when the count is not a multiple of 16; see ``rng._ranges``), checked
once per dtype on the installed torch against a whole ``normal_``
(:func:`chunks_match`); or the cached-normal path (fewer than 16 elements, or
strided ones: ``rng._cached_normal``), whose cached sample carries from round
to round and is left in the generator as eager's loop leaves it. A strided
tensor's elements are taken in its TensorIterator order, the same in every
round: ``empty_like`` keeps the dimension order, and so does ``where``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from torchdefer.rng import _cached_normal, mt19937

__all__ = ["CHUNK", "NormalRejection", "chunks_match", "normal_rejection_end"]

CHUNK = 1 << 18  # elements drawn at a time (1 MiB of float32)
_BLOCK = 16


def _per_uniform(dtype: torch.dtype) -> int:
    return 2 if dtype == torch.float64 else 1


_START = "start"  # the loop's first state's own cached sample (a round-state cache)
# A round state's cached sample: _START, None (none), or the word its pair was drawn at.
_Cache = str | int | None


@dataclass(frozen=True, slots=True)
class NormalRejection:
    """One rejection loop of whole-tensor ``normal_(mean, std)`` rounds on ``n`` elements,
    keeping each element's first value in ``[lo, hi]`` (bounds in the dtype).

    Elements are counted by *position*: their place in the draw order, the same
    in every round (the tensor's TensorIterator order: ``empty_like`` and
    ``where`` keep its dimension order). ``serial`` says whether the first round
    and the later ones take the cached-normal path (``rng._cached_normal``:
    fewer than 16 elements, or a non-contiguous tensor, or later rounds on the
    dense ``empty_like`` of one not in row-major order); else the fill path.
    ``in_order``: positions are the elements' indices (a contiguous tensor),
    which :meth:`rows` needs.
    """

    n: int
    dtype: torch.dtype
    mean: float
    std: float
    lo: float
    hi: float
    round_words: int  # words one fill-path round's normal_ draws (the draw model's)
    serial: tuple[bool, bool] = (False, False)
    in_order: bool = True

    def end(self, state: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """The generator state after the loop, started from ``state``."""
        state_at = functools.partial(mt19937.advance, state)
        word, cache, _ = self._loop(state_at, 0, self.n, None, chunk)
        return _round_state(state_at, word, cache)

    def rows(
        self, s: int, e: int, out: torch.Tensor, state_at: Callable[[int], torch.Tensor],
        chunk: int | None = None,
    ) -> int | None:
        """The final values of elements ``[s, e)`` into ``out``; returns elements drawn
        (None where positions are not the elements' indices: nothing written).

        ``state_at(words)`` is the generator state ``words`` past the loop's first
        word, with the first state's cached sample (one jump a round). The first
        round draws the range straight into ``out``, chunk by chunk; later rounds
        draw only the chunks holding an element still rejected, and the rounds
        stop when every element of the range is accepted: a row shard pays its
        own rounds, not the tensor's.
        """
        if not self.in_order:
            return None
        return self._loop(state_at, s, e, out, chunk)[2]

    def _loop(
        self,
        state_at: Callable[[int], torch.Tensor],
        s: int,
        e: int,
        out: torch.Tensor | None,
        chunk: int | None,
    ) -> tuple[int, _Cache, int]:
        """Rounds until every position of ``[s, e)`` is accepted: (word, cache) where the
        round after the last starts, and values drawn."""
        waiting: torch.Tensor | None = None  # sorted positions still rejected; None: all
        cache: _Cache = _START
        word, drawn, first = 0, 0, True
        if self.n == 0:
            return word, cache, drawn
        while waiting is None or waiting.numel():
            start = _round_state(state_at, word, cache)
            serial = self.serial[0] if first else self.serial[1]
            rejected: list[torch.Tensor] = []
            for a, values, indices in self._draw(start, serial, waiting, s, e, chunk):
                drawn += values.numel()
                if indices is None:  # first round: every value in place, rejected or not
                    if out is not None:
                        out[a - s : a - s + values.numel()] = values
                    rejected.append(self._rejected(values).nonzero().reshape(-1) + a)
                    continue
                mine = values[indices - a]
                bad = self._rejected(mine)
                if out is not None:
                    out[indices[~bad] - s] = mine[~bad]
                rejected.append(indices[bad])
            waiting = torch.cat(rejected) if rejected else torch.empty(0, dtype=torch.int64)
            word, cache = self._next(start, word, cache, serial)
            first = False
        return word, cache, drawn

    def _draw(
        self,
        start: torch.Tensor,
        serial: bool,
        waiting: torch.Tensor | None,
        s: int,
        e: int,
        chunk: int | None,
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None]]:
        args = (self.n, self.dtype, self.mean, self.std)
        if serial:
            return _cached_normal.round_values(start, *args, chunk or CHUNK, waiting, s, e)
        blocks = max(_BLOCK, (chunk or CHUNK) // _BLOCK * _BLOCK)  # the fill path's blocks whole
        return _round(start, *args, self.round_words, blocks, waiting, s, e)

    def _next(
        self, start: torch.Tensor, word: int, cache: _Cache, serial: bool
    ) -> tuple[int, _Cache]:
        """Where the next round starts: its word, and its cached sample."""
        if not serial:  # the fill path leaves the cache as it found it
            return word + self.round_words, cache
        drawn, cached = _cached_normal.words(self.n, mt19937.cache_valid(start))
        return word + drawn, (word + drawn - 4 if cached else None)

    def _rejected(self, values: torch.Tensor) -> torch.Tensor:
        return (values < self.lo) | (values > self.hi)


def _round_state(
    state_at: Callable[[int], torch.Tensor], word: int, cache: _Cache
) -> torch.Tensor:
    """The state at ``word`` with the cached sample ``cache``: the first state's
    (``_START``), none (None), or the sine of the pair drawn at word ``cache``."""
    if isinstance(cache, str):  # _START, the only string
        return state_at(word)
    if cache is None:
        return _cached_normal.without_cache(state_at(word))
    pair = _cached_normal.without_cache(state_at(cache))
    return mt19937.advance(_cached_normal.one_normal(pair), word - cache - 4)


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
    """The CPU generator state after the rejection loop on ``n`` contiguous elements
    (16 or more: every round on the fill path).

    Args:
        state: the generator's state when the loop starts.
        n, dtype: the tensor's size (16 or more, contiguous) and dtype.
        mean, std: the ``normal_`` arguments.
        lo, hi: the bounds as the loop compares them (already in the dtype).
        round_words: words one whole-tensor ``normal_`` draws (the draw model's).
        chunk: elements drawn at a time (a multiple of 16; default :data:`CHUNK`).
    """
    loop = NormalRejection(n, dtype, mean, std, lo, hi, round_words)
    return loop.end(state, chunk)


def _round(
    state: torch.Tensor,
    n: int,
    dtype: torch.dtype,
    mean: float,
    std: float,
    round_words: int,
    chunk: int,
    waiting: torch.Tensor | None,
    lo: int = 0,
    hi: int | None = None,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None]]:
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
