"""Drawing a part of a random call: elements ``[s, e)`` from their own words only.

The CPU kernels of the common init ops make each element of a contiguous
tensor from words at a fixed place in the call's draws
(``aten/src/ATen/native/cpu/DistributionTemplates.h``):

* **per element** (``uniform_``, ``random_``, ``rand``, ``randint``,
  ``exponential_`` ...): a serial loop, element ``i`` from words
  ``[a*i, a*i + a)``, ``a`` words an element (two for float64);
* **Box-Muller blocks** (``normal_``/``randn`` on 16 or more contiguous
  elements): block ``k`` (elements ``[16k, 16k + 16)``) from the 16 uniforms
  ``[16k, 16k + 16)``. When the count is not a multiple of 16 the last 16
  elements are made again from the call's last 16 uniforms: float32 and
  float64 first draw a uniform for every element, float16 and bfloat16 only
  for the whole blocks; either way the last 16 uniforms end the call, so the
  draw model's word count says where they start.

Elements ``[s, e)`` then cost their own draws (plus at most two partial
blocks) and a jump to their first word. As with the draw model, this reading
of the kernels is not trusted: each class of call is checked once on the
installed torch by drawing a probe call whole and in pieces
(:func:`element_model`); a class that fails is not sliced.

This module only knows generator states and calls given as functions; which
recorded call to slice, and from which state, is ``torchdefer.materialize``'s.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from torchdefer.rng import mt19937
from torchdefer.rng.draws import Effect

__all__ = ["BLOCK", "ElementModel", "draw_range", "element_model"]

BLOCK = 16  # elements per Box-Muller block of the CPU normal kernels

# run(out, state) draws len(out) elements of the call into the 1-D contiguous
# `out` from generator `state`; returns the state after.
Runner = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# state_at(words): the generator state `words` past the call's first word.
StateAt = Callable[[int], torch.Tensor]


@dataclass(frozen=True, slots=True)
class ElementModel:
    """Where a call's elements take their words from."""

    blocks: bool  # Box-Muller blocks of 16; else one element after the other
    words: int  # words an element (per element) or a uniform (blocks)


def element_model(
    key: Hashable,
    blocks: bool,
    effect_of: Callable[[int], Effect | None],
    run: Runner,
    dtype: torch.dtype,
    device: torch.device,
) -> ElementModel | None:
    """The element model of a class of call, or None if its draws cannot be sliced.

    Args:
        key: identifies the class (the op and every argument but the size);
            the probe runs once per key.
        blocks: whether the op makes normals in Box-Muller blocks (``normal_``,
            ``randn``) rather than one element after the other.
        effect_of: the draw model of the call at ``n`` elements.
        run: draws the call into a given tensor from a given state.
        dtype, device: of the tensor drawn into.
    """
    known = _checked.get(key)
    if known is not None or key in _checked:
        return known
    model = _from_effects(blocks, effect_of)
    if model is not None and not _probe(model, effect_of, run, dtype, device):
        model = None
    _checked[key] = model
    return model


# One entry per class of call seen (a model has a handful); like the draw
# model's cache, it lives as long as the process.
_checked: dict[Hashable, ElementModel | None] = {}


def _from_effects(blocks: bool, effect_of: Callable[[int], Effect | None]) -> ElementModel | None:
    sizes = (1, 2, 37) if not blocks else (16, 17, 32, 48)
    effects = {n: effect_of(n) for n in sizes}
    if any(e is None or e.normals for e in effects.values()):
        return None
    words = {n: e.words for n, e in effects.items()}  # type: ignore[union-attr]
    if not blocks:
        a = words[1]
        ok = a > 0 and all(w == a * n for n, w in words.items())
        return ElementModel(False, a) if ok else None
    a = words[16] // BLOCK
    # 17 elements: one block plus the last 16 again, after 17 uniforms or 16.
    ok = a > 0 and words[32] == 32 * a and words[48] == 48 * a and words[17] in (33 * a, 32 * a)
    return ElementModel(True, a) if ok else None


def _probe(
    model: ElementModel,
    effect_of: Callable[[int], Effect | None],
    run: Runner,
    dtype: torch.dtype,
    device: torch.device,
) -> bool:
    """Draw probe calls whole and in pieces from one state; every piece must match."""
    state = torch.Generator().manual_seed(0x51ACE).get_state()
    sizes = (37,) if not model.blocks else (48, 50, 53)
    for n in sizes:
        whole = torch.empty(n, dtype=dtype, device=device)
        run(whole, state)
        effect = effect_of(n)
        if effect is None:
            return False
        cuts = sorted({0, 1, 5, 15, 16, 17, 33, n - 17, n - 16, n - 15, n - 1, n})
        pieces = [(a, b) for a, b in itertools.pairwise(cuts) if a < b] + [(3, n - 3), (0, n)]
        for s, e in pieces:
            out = torch.empty(e - s, dtype=dtype, device=device)
            draw_range(model, n, effect.words, s, e, out, lambda w: mt19937.advance(state, w), run)
            if not torch.equal(out, whole[s:e]):
                return False
    return True


def draw_range(
    model: ElementModel,
    n: int,
    total_words: int,
    s: int,
    e: int,
    out: torch.Tensor,
    state_at: StateAt,
    run: Runner,
) -> None:
    """Elements ``[s, e)`` of a call drawing ``n`` elements, into ``out`` (``e - s`` long).

    ``total_words`` is what the whole call draws (the draw model's count);
    ``state_at`` gives the state at a word of the call, ``run`` draws.
    """
    if s >= e:
        return
    if not model.blocks:
        run(out, state_at(model.words * s))
        return
    # With a remainder, the last 16 elements come from the last 16 uniforms.
    redone = n - BLOCK if n % BLOCK else n
    tail = total_words - BLOCK * model.words  # the word those uniforms start at
    state, at = None, 0
    if s < redone:
        state, at = _blocks(model, s, min(e, redone), out[: min(e, redone) - s], state_at, run)
    if e > redone:
        # Just past the blocks drawn, the tail is a few words on: no second jump.
        start = mt19937.advance(state, tail - at) if state is not None else state_at(tail)
        block = torch.empty(BLOCK, dtype=out.dtype, device=out.device)
        run(block, start)
        first = max(s, redone)
        out[first - s :].copy_(block[first - redone : e - redone])


def _blocks(
    model: ElementModel, s: int, e: int, out: torch.Tensor, state_at: StateAt, run: Runner
) -> tuple[torch.Tensor, int]:
    """Elements ``[s, e)`` of whole blocks: the end blocks through a 16-element buffer
    when only part of them is wanted, the blocks between straight into ``out``.
    Returns the state after the last block drawn and its word."""
    first = s // BLOCK
    state = state_at(model.words * BLOCK * first)
    at = s
    if s % BLOCK:
        state = _partial(first, s, e, out, state, run)
        at = min(e, (first + 1) * BLOCK)
    whole = (e - at) // BLOCK * BLOCK
    if whole:
        state = run(out[at - s : at - s + whole], state)
        at += whole
    if at < e:
        state = _partial(at // BLOCK, s, e, out, state, run)
    return state, model.words * BLOCK * -(-e // BLOCK)


def _partial(
    k: int, s: int, e: int, out: torch.Tensor, state: torch.Tensor, run: Runner
) -> torch.Tensor:
    """Block ``k`` drawn whole into a buffer; its elements within ``[s, e)`` into ``out``."""
    lo, hi = max(s, k * BLOCK), min(e, (k + 1) * BLOCK)
    block = torch.empty(BLOCK, dtype=out.dtype, device=out.device)
    state = run(block, state)
    out[lo - s : hi - s].copy_(block[lo - k * BLOCK : hi - k * BLOCK])
    return state
