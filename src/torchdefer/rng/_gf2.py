"""Polynomials over GF(2) modulo the characteristic polynomial of mt19937.

A polynomial is a Python ``int``: bit ``i`` is the coefficient of ``x**i``.
Advancing mt19937 by ``n`` words is multiplying its state by ``x**n`` modulo
its characteristic polynomial ``P`` (Haramoto et al., "Efficient jump ahead
for F2-linear random number generators", 2008), so a jump needs ``x**n mod P``.

``P`` has degree 19937 and only 135 terms (``EXPONENTS``, found by
Berlekamp-Massey on the generator's output and checked by the tests). A power
is a product of entries of a table of ``x**(d * 256**k * 2**15)``, one per
nonzero base-256 digit of ``n`` above its 15th bit, times ``x**(n mod
2**15)`` (shifts and reductions); products run as float64 FFT convolutions
(exact: every coefficient sum is below 2**15) and the reduction modulo ``P``
is Barrett's: one dense product by the precomputed ``floor(x**(2*DEGREE) /
P)`` and a product by the sparse ``P`` (135 shifts). Squaring over GF(2) only
spreads the bits apart. The FFTs are numpy's (pocketfft): torch's CPU FFT
took 2.5x longer on the machines measured (0.40 vs 0.17 ms a transform). A
multiplication with its reduction costs ~1 ms on one core.

The table's first ``TABLE_DIGITS`` digits (every distance below ``2**47``
words) and the Barrett constant ship with the package (``_x_powers.bin``,
written by ``python -m torchdefer.rng._x_powers`` and checked against this
module's own computation by ``tests/rng/test_x_powers.py``): filling them in a
fresh process cost ~45 ms of the first recording's end-of-recording jump.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from torchdefer.errors import InternalError, UsageError

__all__ = [
    "DEGREE",
    "DIGIT_BITS",
    "ENTRY_BYTES",
    "EXPONENTS",
    "TABLE_DIGITS",
    "P",
    "barrett_constant",
    "clmul",
    "computed_table",
    "reduce",
    "tensor_bytes",
    "x_power_mod",
]

DEGREE = 19937
EXPONENTS = (
    0, 1189, 1416, 1585, 1643, 1870, 2493, 2773, 3000, 3227, 3454, 3681, 3908, 4135, 4362,
    4753, 5661, 6337, 6569, 7129, 7477, 7525, 7583, 7752, 7979, 8206, 9505, 9901, 9969, 10128,
    10693, 10761, 10920, 11089, 11147, 11157, 11215, 11321, 11374, 11384, 11485, 11611, 11712,
    11717, 11838, 11881, 11944, 11997, 12277, 12335, 12393, 12504, 12509, 12620, 12673, 12731,
    12736, 12789, 12905, 12958, 12963, 13137, 13185, 13190, 13243, 13301, 13412, 13528, 13533,
    13639, 13697, 13760, 13813, 13866, 14093, 14151, 14209, 14320, 14325, 14436, 14547, 14552,
    14605, 14721, 14774, 14779, 14953, 15001, 15006, 15059, 15117, 15228, 15344, 15349, 15455,
    15513, 15576, 15629, 15682, 15909, 15967, 16025, 16136, 16141, 16252, 16363, 16368, 16421,
    16537, 16590, 16595, 16817, 16822, 16875, 16933, 17044, 17160, 17271, 17329, 17445, 17498,
    17725, 17783, 17841, 17952, 18068, 18179, 18237, 18406, 18633, 18691, 18860, 19087, 19314,
    19937,
)  # fmt: skip
P = sum(1 << e for e in EXPONENTS)

# FFT length for a product of two polynomials below degree DEGREE: at least
# 2 * DEGREE - 1 coefficients; 40960 = 2**13 * 5 transforms as fast as 32768.
_FFT_SIZE = 40960


def _bits(a: int) -> np.ndarray:
    """The coefficients of ``a`` (degree below ``_FFT_SIZE``) as a float64 vector."""
    raw = np.frombuffer(a.to_bytes(_FFT_SIZE // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little").astype(np.float64)


def _from_parity(counts: np.ndarray) -> int:
    """The polynomial whose coefficient ``i`` is ``counts[i]`` mod 2 (counts near integers)."""
    rounded = np.rint(counts)
    if np.abs(counts - rounded).max() > 0.25:  # cannot happen below 2**40 terms
        raise InternalError("a GF(2) product lost precision in the FFT; this is a bug in "
                            "torchdefer, please report it (TORCHDEFER_RNG_JUMPS=0 avoids jumps)")
    parity = (rounded.astype(np.int64) & 1).astype(np.uint8)
    return int.from_bytes(np.packbits(parity, bitorder="little").tobytes(), "little")


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The bytes of a contiguous CPU tensor."""
    t = t.contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def _spectrum(a: int) -> np.ndarray:
    return np.fft.rfft(_bits(a))


def clmul(a: int, b: int) -> int:
    """The product of two polynomials of degree below ``DEGREE``."""
    return _from_parity(np.fft.irfft(_spectrum(a) * _spectrum(b), n=_FFT_SIZE))


def barrett_constant() -> int:
    """``floor(x**(2 * DEGREE) / P)``, by long division (~3 ms; shipped, see ``_barrett``)."""
    remainder, quotient = 1 << (2 * DEGREE), 0
    while remainder.bit_length() > DEGREE:
        shift = remainder.bit_length() - 1 - DEGREE
        quotient |= 1 << shift
        remainder ^= P << shift
    return quotient


@functools.cache
def _barrett_value() -> int:
    """The Barrett constant: the shipped file's last polynomial, or computed."""
    shipped = _shipped_raw()
    if shipped is None:
        return barrett_constant()
    return int.from_bytes(shipped[-ENTRY_BYTES:], "little")


@functools.cache
def _barrett() -> np.ndarray:
    return _spectrum(_barrett_value())


def _times_p(q: int) -> int:
    out = 0
    for e in EXPONENTS:
        out ^= q << e
    return out


def reduce(r: int) -> int:
    """``r mod P`` for ``r`` of degree below ``2 * DEGREE`` (Barrett reduction)."""
    high = r >> DEGREE
    if not high:
        return r
    product = np.fft.irfft(_spectrum(high) * _barrett(), n=_FFT_SIZE)
    quotient = _from_parity(product[DEGREE - DEGREE % 8 :]) >> (DEGREE % 8)
    out = r ^ _times_p(quotient)
    if out >> DEGREE:
        raise InternalError("GF(2) Barrett reduction left a remainder of too high degree; this "
                            "is a bug in torchdefer, please report it (TORCHDEFER_RNG_JUMPS=0 "
                            "avoids jumps)")
    return out


def _square(a: int) -> int:
    """``a * a`` over GF(2): bit ``i`` moves to bit ``2 * i``."""
    raw = a.to_bytes((a.bit_length() + 7) // 8 or 1, "little")
    spread = bytearray(2 * len(raw))
    spread[0::2] = raw.translate(_SPREAD_LOW)
    spread[1::2] = raw.translate(_SPREAD_HIGH)
    return int.from_bytes(spread, "little")


def _spread_nibble(n: int) -> int:
    return sum(((n >> i) & 1) << (2 * i) for i in range(4))


_SPREAD_LOW = bytes(_spread_nibble(b & 15) for b in range(256))
_SPREAD_HIGH = bytes(_spread_nibble(b >> 4) for b in range(256))


# x**n is assembled from a table of x**(d * 256**k * 2**15) mod P (d = 1..255),
# whose entries are shipped or computed when first needed and kept (as
# polynomials, not spectra: 2.5 kB against 330 kB an entry, for ~16% of a
# multiplication): a power then costs one multiplication per nonzero base-256
# digit of n above its 15th bit but the first (two for an 8B model's distance,
# three up to 2**47 words) and one or two reductions for the low bits, not one
# squaring per bit. Base 256, not 16: half the multiplications, for a shipped
# file of 2.5 MB instead of 260 kB.
_LOW_BITS = 15
DIGIT_BITS = 8
_DIGIT = (1 << DIGIT_BITS) - 1  # entries per digit: d = 1.._DIGIT
_table: dict[tuple[int, int], int] = {}  # 2.5 kB an entry, at most 255 per digit


def _mulmod(a: int, b: int) -> int:
    return reduce(clmul(a, b))


TABLE_DIGITS = 4  # shipped entries: k < 4, every distance below 2**(15 + 8 * 4)
ENTRY_BYTES = (DEGREE + 7) // 8  # one polynomial of the shipped file, little-endian
_SHIPPED = "_x_powers.bin"
# The shipped file: the entries (k, d), k-major, then the Barrett constant.
_SHIPPED_BYTES = (TABLE_DIGITS * _DIGIT + 1) * ENTRY_BYTES


def _entry(k: int, d: int) -> int:
    """``x**(d * 256**k * 2**15) mod P``: shipped, or computed once and kept."""
    found = _table.get((k, d))
    if found is not None:
        return found
    shipped = _shipped_raw()
    if shipped is None or k >= TABLE_DIGITS:
        return _compute(k, d, _table)
    start = (_DIGIT * k + d - 1) * ENTRY_BYTES
    found = _table[(k, d)] = int.from_bytes(shipped[start : start + ENTRY_BYTES], "little")
    return found


@functools.cache
def _shipped_raw() -> bytes | mmap.mmap | None:
    """The shipped file, or None if it is missing or of the wrong size.

    Mapped, not read: a jump reads five of its 1021 polynomials (reading the
    2.5 MB took ~1.2 ms of a fresh process's first jump). Where the package
    is not on disk (a zip), read whole through importlib.
    """
    raw: bytes | mmap.mmap
    try:
        with open(Path(__file__).with_name(_SHIPPED), "rb") as f:
            raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        try:
            raw = resources.files(__package__).joinpath(_SHIPPED).read_bytes()
        except OSError:
            return None
    if len(raw) != _SHIPPED_BYTES:
        return None  # not the file this module writes: compute instead
    return raw


def computed_table(digits: int = TABLE_DIGITS) -> bytes:
    """The entries ``k < digits``, ``d = 1..255``, then the Barrett constant, computed
    from scratch, as shipped.

    What ``python -m torchdefer.rng._x_powers`` writes and the tests compare
    the shipped file with; reads no entry of the shipped file, and refuses to
    run if its Barrett constant (which every reduction uses) is not the one
    computed here.
    """
    constant = barrett_constant()
    if _barrett_value() != constant:
        raise InternalError(f"{_SHIPPED} holds a wrong Barrett constant; delete it and run "
                            "`python -m torchdefer.rng._x_powers` to write it again")
    table: dict[tuple[int, int], int] = {}
    entries = [_compute(k, d, table) for k in range(digits) for d in range(1, _DIGIT + 1)]
    return b"".join(e.to_bytes(ENTRY_BYTES, "little") for e in [*entries, constant])


def _compute(k: int, d: int, table: dict[tuple[int, int], int]) -> int:
    """``x**(d * 256**k * 2**15) mod P`` from ``table``'s smaller entries; kept in ``table``."""
    found = table.get((k, d))
    if found is not None:
        return found
    if d == 1:
        if k == 0:
            value = reduce(1 << (1 << _LOW_BITS))
        else:
            value = _compute(k - 1, 1, table)
            for _ in range(DIGIT_BITS):
                value = reduce(_square(value))
    elif d % 2 == 0:
        value = reduce(_square(_compute(k, d // 2, table)))
    else:
        value = _mulmod(_compute(k, d - 1, table), _compute(k, 1, table))
    table[(k, d)] = value
    return value


@functools.lru_cache(maxsize=256)
def x_power_mod(n: int) -> int:
    """``x**n mod P`` (cached: the same jump distances recur across layers)."""
    if n < 0:
        raise UsageError(f"x_power_mod({n}): the power must be >= 0")
    if n < DEGREE:
        return 1 << n
    r: int | None = None
    high, k = n >> _LOW_BITS, 0
    while high:
        digit = high & _DIGIT
        if digit:
            r = _entry(k, digit) if r is None else _mulmod(r, _entry(k, digit))
        high >>= DIGIT_BITS
        k += 1
    if r is None:
        r = 1
    # Times x**(n mod 2**15): shifts by at most DEGREE keep r below degree
    # 2 * DEGREE, what one reduction takes.
    low = n & ((1 << _LOW_BITS) - 1)
    while low:
        step = min(low, DEGREE)
        r = reduce(r << step)
        low -= step
    return r
