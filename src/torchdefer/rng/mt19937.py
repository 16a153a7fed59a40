"""The CPU generator's state, and moving it ahead without drawing the numbers.

A CPU ``torch.Generator`` is mt19937 (``ATen/core/MT19937RNGEngine.h``): an
array of 624 32-bit words refilled all at once when used up, ``left`` counting
down to the refill and ``next`` the index of the word to read. Its
``get_state()`` is ``CPUGeneratorImplState`` (``ATen/CPUGeneratorImpl.cpp``),
5056 bytes::

    0     the_initial_seed  u64        5016  normal_x    f64 (unused)
    8     left              i32        5024  normal_y    f64: cached double normal
    12    seeded            i32        5032  normal_rho  f64 (unused)
    16    next              u64        5040  normal_is_valid i32
    24    state[624]        u64 each   5048  next_float_normal_sample f32, valid u8

:func:`advance` moves the engine ``n`` words ahead. A short distance is drawn
for real (exact by construction, ~3 ns a word); a long one jumps: the array
``k`` refills ahead is the sum over GF(2) of the word windows selected by the
coefficients of ``x**(624k - 1) mod P`` (``gf2``), ~1 ms plus the power
(~1 ms a base-256 digit of the distance). The layout is checked once
against the installed torch (:func:`layout_known`); if it ever differs, every
distance is drawn for real, slower but still exact.
The normal-sample caches are left as they are: they belong to the draw model.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator

import numpy as np
import torch

from torchdefer._compat.patch import patched, setting
from torchdefer.errors import UsageError
from torchdefer.rng._gf2 import DEGREE, x_power_mod

__all__ = [
    "STATE_BYTES",
    "advance",
    "array_of",
    "cache_valid",
    "fresh",
    "intra_op_shared",
    "layout_known",
    "one_thread",
    "with_engine",
    "without_cached_normal",
    "words_left_in_block",
]

N = 624  # words per refill
STATE_BYTES = 5056
_LEFT, _SEEDED, _NEXT, _ARRAY = 8, 12, 16, 24
ENGINE = slice(0, _ARRAY)  # seed and position fields
ARRAY = slice(_ARRAY, _ARRAY + 8 * N)  # the 624 words, 8 bytes each
CACHES = slice(_ARRAY + 8 * N, STATE_BYTES)  # the normal-sample caches
NORMAL_Y, NORMAL_VALID = 5024, 5040  # the cached double normal and its flag
_FLOAT_VALID = 5052  # next_float_normal_sample's flag
# Up to here drawing for real (~2-3 ns a word) costs about what a jump whose
# power of x is new costs (~1.5-2.5 ms: measured 2026-11-26, 4 ms at 2**21
# words against 2 ms; with torch's FFT a new power took 5-40 ms and this was
# 2**22). A jump whose power was computed before (the same number of refills:
# chunks of equal size, layers of equal shape) costs ~1-2 ms (the window
# XORs), cheaper than drawing from _WARM_LIMIT words on.
_DRAW_LIMIT = 1 << 21
_WARM_LIMIT = 1 << 20
_WARM_MAX = 256  # as gf2.x_power_mod's cache: beyond it a power may be gone again
_CHUNK = 1 << 20  # words drawn per call when drawing for real
_WINDOWS_PER_CHUNK = 512  # windows XORed at a time in a jump (1.3 MB)


def _field(state: torch.Tensor, offset: int, dtype: torch.dtype) -> int:
    size = dtype.itemsize
    return int(state[offset : offset + size].view(dtype).item())


def array_of(state: torch.Tensor) -> torch.Tensor:
    """The 624 words of the engine's array, as int64 values in ``[0, 2**32)``."""
    return state[ARRAY].view(torch.int64)


def cache_valid(state: torch.Tensor) -> bool:
    """Whether a CPU state holds a cached double normal sample."""
    return bool(state[NORMAL_VALID].item())


def fresh(state: torch.Tensor) -> bool:
    """Whether ``state`` is as ``manual_seed`` leaves it: nothing drawn, no cached sample.

    Seeding sets ``left`` to 1 and ``next`` to 0; every state after a draw
    has ``next`` > 0 (a used-up block leaves ``left`` 1 with ``next`` 624).
    """
    if state.numel() != STATE_BYTES:
        return False
    untouched = _field(state, _LEFT, torch.int32) == 1 and _field(state, _NEXT, torch.int64) == 0
    return untouched and not cache_valid(state) and not bool(state[_FLOAT_VALID].item())


def without_cached_normal(state: torch.Tensor) -> torch.Tensor:
    """``state`` holding no cached double normal (as ``get_state`` writes it: zeroed)."""
    if not cache_valid(state):
        return state
    out = state.clone()
    out[NORMAL_Y : NORMAL_Y + 8].zero_()
    out[NORMAL_VALID : NORMAL_VALID + 4].zero_()
    return out


def words_left_in_block(state: torch.Tensor) -> int:
    """How many words the engine gives before its next refill."""
    return _field(state, _LEFT, torch.int32) - 1


def with_engine(state: torch.Tensor, array: torch.Tensor, consumed: int) -> torch.Tensor:
    """``state`` with the engine's ``array`` of words, ``consumed`` of them drawn already."""
    out = state.clone()
    out[_ARRAY : _ARRAY + 8 * N].view(torch.int64).copy_(array)
    out[_LEFT : _LEFT + 4].view(torch.int32).fill_(N + 1 - consumed)
    out[_NEXT : _NEXT + 8].view(torch.int64).fill_(consumed)
    return out


def advance(state: torch.Tensor, words: int, *, recurring: bool = False) -> torch.Tensor:
    """``state`` with its engine ``words`` draws of 32 bits further on.

    ``recurring``: the caller will ask for this distance again (chunks of
    tensors of one shape), so from ``_WARM_LIMIT`` words on a jump is taken
    even if its power of x is new: it is computed once and known after.
    """
    if words < 0:
        raise UsageError(f"advance(state, {words}): cannot move a generator back; words "
                         "must be >= 0")
    if words <= _WARM_LIMIT or not layout_known():
        return _draw(state, words)
    consumed = N - words_left_in_block(state)
    target = consumed + words
    blocks = (target - 1) // N
    if words <= _DRAW_LIMIT and blocks not in _warm and not recurring:
        return _draw(state, words)
    with one_thread():
        array = _refills_ahead(array_of(state), blocks)
    if len(_warm) >= _WARM_MAX:
        _warm.clear()
    _warm.add(blocks)
    return with_engine(state, array, target - N * blocks)


# Refill counts whose jump polynomial was computed already (gf2 caches it).
# A set shared by threads: adding and clearing are atomic under the GIL, and a
# wrong answer only chooses the slower of two exact ways.
_warm: set[int] = set()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the jump's many small tensor ops on one thread.

    They are ~40k elements each: split over the intra-op pool they gain
    nothing, and when another process holds the other core the pool's
    threads wait on each other (a jump took 5x longer on a busy machine).
    Not where other threads run kernels meanwhile (:func:`intra_op_shared`):
    the setting is process-wide, and some kernels' bits depend on it.
    """
    if _shared.get():
        yield
        return
    with patched(_NUM_THREADS, 1):  # writes nothing where it is 1 already
        yield


@contextlib.contextmanager
def intra_op_shared() -> Iterator[None]:
    """In this block, :func:`one_thread` leaves torch's intra-op threads alone: other
    threads run kernels (``materialize_module(threads=N)``'s tensors side by side)
    whose bits may depend on the setting (LAPACK's QR, parallel sums)."""
    token = _shared.set(True)
    try:
        yield
    finally:
        _shared.reset(token)


_shared: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "torchdefer_intra_op_shared", default=False
)


_NUM_THREADS = setting(torch.get_num_threads, torch.set_num_threads)


def _draw(state: torch.Tensor, words: int) -> torch.Tensor:
    """Move ahead by drawing: ``random_`` on int32 takes one 32-bit word an element."""
    generator = torch.Generator()
    generator.set_state(state)
    buffer = torch.empty(min(words, _CHUNK), dtype=torch.int32, device="cpu")
    while words > 0:
        part = buffer[: min(words, _CHUNK)]
        part.random_(generator=generator)
        words -= part.numel()
    return generator.get_state()


def _sequence(array: torch.Tensor, refills: int) -> torch.Tensor:
    """The words ``w[0 .. 624 * (refills + 1))`` that follow from ``array = w[0:624]``.

    Drawn with torch's own engine: an array with one word left refills on the
    next draw, and after 624 draws ``get_state`` holds the next array.
    """
    generator = torch.Generator()
    state = generator.get_state()
    state[_ARRAY : _ARRAY + 8 * N].view(torch.int64).copy_(array)
    state[_LEFT : _LEFT + 4].view(torch.int32).fill_(1)
    state[_NEXT : _NEXT + 8].view(torch.int64).fill_(N)
    generator.set_state(state)
    blocks = [array]
    scratch = torch.empty(N, dtype=torch.int32, device="cpu")
    for _ in range(refills):
        scratch.random_(generator=generator)
        blocks.append(array_of(generator.get_state()).clone())
    return torch.cat(blocks)


def _refills_ahead(array: torch.Tensor, blocks: int) -> torch.Tensor:
    """The engine's array ``blocks`` refills after ``array``.

    Every word ``w[n]`` with ``n >= 1`` is a linear function of the 19937-bit
    state, so ``w[n + 1 + j] = XOR of w[i + 1 + j]`` over the set coefficients
    ``i`` of ``x**n mod P``; the array wanted is ``w[624 * blocks + j]``.
    In numpy: torch has no XOR reduction, and its small ops cost more here.
    """
    if blocks <= _WARM_LIMIT // N:
        return _sequence(array, blocks)[N * blocks :]
    coefficients = x_power_mod(N * blocks - 1)
    words = _sequence(array, (DEGREE + N) // N + 1)[1:].to(torch.int32).numpy()
    windows = np.lib.stride_tricks.sliding_window_view(words, N)
    selected = _set_bits(coefficients)
    # In chunks: all ~10,000 selected windows at once would be 25 MB of
    # temporaries, which page-fault on every jump under a low mmap threshold.
    total = np.zeros(N, dtype=np.int32)
    for start in range(0, len(selected), _WINDOWS_PER_CHUNK):
        chunk = selected[start : start + _WINDOWS_PER_CHUNK]
        total ^= np.bitwise_xor.reduce(windows[chunk], axis=0)
    return torch.from_numpy(total).to(torch.int64) & 0xFFFFFFFF


def _set_bits(c: int) -> np.ndarray:
    """The indices of the set coefficients of ``c``."""
    raw = np.frombuffer(c.to_bytes((c.bit_length() + 7) // 8, "little"), dtype=np.uint8)
    return np.flatnonzero(np.unpackbits(raw, bitorder="little"))


@functools.cache
def layout_known() -> bool:
    """Whether this torch's CPU generator state has the layout :func:`advance` edits.

    Checked once: a seeded state must read as mt19937's initialisation, and
    jumps built from the layout must land where drawing for real lands.
    """
    generator = torch.Generator()
    generator.manual_seed(5489)
    state = generator.get_state()
    if state.numel() != STATE_BYTES or state.dtype != torch.uint8:
        return False
    array = array_of(state)
    first = 5489 & 0xFFFFFFFF
    second = (1812433253 * (first ^ (first >> 30)) + 1) & 0xFFFFFFFF
    if (array[0].item(), array[1].item()) != (first, second):
        return False
    if (_field(state, _LEFT, torch.int32), _field(state, _SEEDED, torch.int32)) != (1, 1):
        return False
    for words in (1, 623, 624, 625, 5 * N + 17):
        drawn = _draw(state, words)
        consumed = N - words_left_in_block(state)
        target = consumed + words
        blocks = (target - 1) // N
        built = with_engine(state, _sequence(array, blocks)[N * blocks :], target - N * blocks)
        if not torch.equal(built, drawn):
            return False
    return True
