"""The CPU's cached-normal ``normal_`` path, drawn in chunks: one round of a rejection loop.

``normal_`` on fewer than 16 or on non-contiguous elements runs
``cpu_serial_kernel`` with ``at::normal_distribution<double>`` in the tensor's
TensorIterator order (``aten/src/ATen/native/cpu/DistributionTemplates.h``):
each element takes the generator's cached double normal if one is valid, else
draws a Box-Muller pair from two 53-bit uniforms (four 32-bit words), takes
its cosine and leaves its sine cached for the next element, or for the next
call. So, in iteration order, position 0 takes the cached sample where the
state holds one, and the other positions go in pairs from consecutive words:
any run of positions is drawn on its own from the state at its pair's first
word, into a stride-2 buffer (non-contiguous: the same serial path).

The state after such a call is the engine ``4 * pairs`` words on, with the
last pair's sine cached when the fresh count is odd: made exactly as the call
made it, by drawing that last pair (:func:`after`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from torchdefer.rng import mt19937

__all__ = ["after", "one_normal", "round_values", "without_cache", "words"]


def without_cache(state: torch.Tensor) -> torch.Tensor:
    """``state`` with no cached double normal (a copy where it had one)."""
    if not mt19937.cache_valid(state):
        return state
    out = state.clone()
    out[mt19937.NORMAL_Y : mt19937.NORMAL_Y + 8].zero_()
    out[mt19937.NORMAL_VALID : mt19937.NORMAL_VALID + 4].zero_()
    return out


def one_normal(state: torch.Tensor) -> torch.Tensor:
    """``state`` after one ``at::normal_distribution<double>`` sample, as torch draws it."""
    generator = torch.Generator(device="cpu")
    generator.set_state(state)
    torch.empty(1, dtype=torch.float64, device="cpu").normal_(generator=generator)
    return generator.get_state()


def words(n: int, cached: bool) -> tuple[int, bool]:
    """(words drawn, whether a sample is cached after) of ``n`` serial normals."""
    fresh = n - (1 if cached and n else 0)
    if n == 0:
        return 0, cached
    return 4 * ((fresh + 1) // 2), bool(fresh % 2)


def after(state: torch.Tensor, n: int) -> torch.Tensor:
    """The state after ``n`` serial normals drawn from ``state``."""
    if n == 0:
        return state
    drawn, cached = words(n, mt19937.cache_valid(state))
    base = without_cache(state)
    if not cached:
        return mt19937.advance(base, drawn)
    return one_normal(mt19937.advance(base, drawn - 4))  # the last pair, its sine kept


def round_values(
    state: torch.Tensor, n: int, dtype: torch.dtype, mean: float, std: float, chunk: int,
    waiting: torch.Tensor | None, lo: int = 0, hi: int | None = None,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None]]:
    """(first position, values, waiting positions among them) of positions ``[lo, hi)`` of
    a serial ``normal_(mean, std)`` of ``n`` elements from ``state``, chunk by chunk.

    Only chunks holding a waiting position are drawn (all where ``waiting`` is
    None). The values are a reused buffer's: valid until the next item.
    """
    hi = n if hi is None else hi
    cached = 1 if mt19937.cache_valid(state) and n else 0
    generator = torch.Generator(device="cpu")
    if cached and lo == 0 < hi:
        indices = None if waiting is None else _between(waiting, 0, 1)
        if indices is None or indices.numel():
            generator.set_state(state)
            value = torch.empty(1, dtype=dtype, device="cpu")
            yield 0, value.normal_(mean, std, generator=generator), indices
    chunk += chunk % 2  # whole pairs: a drawn chunk leaves no sample cached
    first = max(lo, cached) - cached  # fresh indices [first, last)
    first -= first % 2
    last = hi - cached
    if last <= first:
        return
    buffer = torch.empty(2 * min(chunk, last - first), dtype=dtype, device="cpu")[::2]
    current, at = without_cache(state), 0  # the fresh index `current` stands at (a pair's)
    for f in range(first, last, chunk):
        size = min(chunk, last - f)
        a, b = max(f + cached, lo), f + size + cached
        indices = None if waiting is None else _between(waiting, a, b)
        if indices is not None and indices.numel() == 0:
            continue
        current = mt19937.advance(current, 2 * (f - at))
        generator.set_state(current)
        values = buffer[:size].normal_(mean, std, generator=generator)
        current, at = without_cache(generator.get_state()), f + size
        yield a, values[a - f - cached :], indices


def _between(indices: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The sorted ``indices`` in ``[lo, hi)``."""
    bounds = torch.tensor([lo, hi], dtype=torch.int64, device="cpu")
    a, b = torch.searchsorted(indices, bounds).tolist()
    return indices[a:b]
