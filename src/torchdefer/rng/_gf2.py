"""Polynomials over GF(2) modulo the characteristic polynomial of mt19937.

A polynomial is a Python ``int``: bit ``i`` is the coefficient of ``x**i``.
Advancing mt19937 by ``n`` words is multiplying its state by ``x**n`` modulo
its characteristic polynomial ``P`` (Haramoto et al., "Efficient jump ahead
for F2-linear random number generators", 2008), so a jump needs ``x**n mod P``.

``P`` has degree 19937 and only 135 terms (``EXPONENTS``, found by
Berlekamp-Massey on the generator's output and checked by the tests). A power
is a product of entries of a table of ``x**(d * 16**k * 2**15)``, one per
hexadecimal digit of ``n``; products run as float64 FFT convolutions (exact:
every coefficient sum is below 2**15) and the reduction modulo ``P`` is
Barrett's: one dense product by the precomputed ``floor(x**(2*DEGREE) / P)``
and a product by the sparse ``P`` (135 shifts). Squaring over GF(2) only
spreads the bits apart. A multiplication costs ~2-3 ms on one core.

The table's first ``TABLE_DIGITS`` digits (every distance below ``2**43``
words) ship with the package (``_x_powers.bin``, written by
``python -m torchdefer.rng._x_powers`` and checked against this module's own
computation by ``tests/rng/test_x_powers.py``): filling them in a fresh process
cost ~45 ms of the first recording's end-of-recording jump.
"""

from __future__ import annotations

import ctypes
import functools
from importlib import resources

import torch

from torchdefer.errors import InternalError, UsageError

__all__ = [
    "DEGREE",
    "ENTRY_BYTES",
    "EXPONENTS",
    "TABLE_DIGITS",
    "P",
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
# 2 * DEGREE - 1 coefficients; 40960 = 2**13 * 5 transforms ~3x faster than
# 65536 with pocketfft here.
_FFT_SIZE = 40960
_SHIFTS = torch.arange(8, dtype=torch.uint8, device="cpu")
_WEIGHTS = (1 << torch.arange(8, dtype=torch.int64, device="cpu")).to(torch.uint8)


def _bits(a: int, length: int) -> torch.Tensor:
    """The coefficients of ``a`` as a float64 vector of ``length`` (a multiple of 8)."""
    raw = torch.frombuffer(bytearray(a.to_bytes(length // 8, "little")), dtype=torch.uint8)
    return ((raw.unsqueeze(1) >> _SHIFTS) & 1).reshape(-1).to(torch.float64)


def _from_parity(counts: torch.Tensor) -> int:
    """The polynomial whose coefficient ``i`` is ``counts[i]`` mod 2 (counts near integers)."""
    rounded = counts.round()
    if (counts - rounded).abs().max().item() > 0.25:  # cannot happen below 2**40 terms
        raise InternalError("a GF(2) product lost precision in the FFT; this is a bug in "
                            "torchdefer, please report it (TORCHDEFER_RNG_JUMPS=0 avoids jumps)")
    parity = (rounded.to(torch.int64) & 1).to(torch.uint8)
    packed = (parity.reshape(-1, 8) * _WEIGHTS).sum(1, dtype=torch.uint8)
    return int.from_bytes(tensor_bytes(packed), "little")


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The bytes of a contiguous CPU tensor (no numpy needed)."""
    t = t.contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def _spectrum(a: int) -> torch.Tensor:
    spectrum: torch.Tensor = torch.fft.rfft(_bits(a, _FFT_SIZE))  # torch.fft is untyped
    return spectrum


def clmul(a: int, b: int) -> int:
    """The product of two polynomials of degree below ``DEGREE``."""
    return _from_parity(torch.fft.irfft(_spectrum(a) * _spectrum(b), n=_FFT_SIZE))


@functools.cache
def _barrett() -> torch.Tensor:
    """The spectrum of ``floor(x**(2 * DEGREE) / P)``, by long division (once, ~40 ms)."""
    remainder, quotient = 1 << (2 * DEGREE), 0
    while remainder.bit_length() > DEGREE:
        shift = remainder.bit_length() - 1 - DEGREE
        quotient |= 1 << shift
        remainder ^= P << shift
    return _spectrum(quotient)


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
    product = torch.fft.irfft(_spectrum(high) * _barrett(), n=_FFT_SIZE)
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


# x**n is assembled from a table of x**(d * 16**k * 2**15) mod P (d = 1..15),
# whose entries are computed when first needed and kept (as polynomials, not
# spectra: 2.5 kB against 330 kB an entry, for ~16% of a multiplication): a
# power then costs one multiplication per hexadecimal digit of n above its
# 15th bit (six for any distance in a 1T-parameter model), not one squaring
# per bit.
_LOW_BITS = 15  # x**(n mod 2**15) has degree < 2 * DEGREE: one reduction
_table: dict[tuple[int, int], int] = {}  # 2.5 kB an entry, at most 15 per digit


def _mulmod(a: int, b: int) -> int:
    return reduce(clmul(a, b))


TABLE_DIGITS = 7  # shipped entries: k < 7, every distance below 2**(15 + 4 * 7)
ENTRY_BYTES = (DEGREE + 7) // 8  # one entry of the shipped table, little-endian
_SHIPPED = "_x_powers.bin"


def _entry(k: int, d: int) -> int:
    """``x**(d * 16**k * 2**15) mod P``: shipped, or computed once and kept."""
    if not _table:
        _table.update(_shipped())
    return _compute(k, d, _table)


def _shipped() -> dict[tuple[int, int], int]:
    """The shipped entries, or none if the file is missing or of the wrong size."""
    try:
        raw = resources.files(__package__).joinpath(_SHIPPED).read_bytes()
    except OSError:
        return {}
    if len(raw) != TABLE_DIGITS * 15 * ENTRY_BYTES:
        return {}  # not the table this module writes: compute instead
    size = ENTRY_BYTES
    return {
        (i // 15, i % 15 + 1): int.from_bytes(raw[i * size : (i + 1) * size], "little")
        for i in range(TABLE_DIGITS * 15)
    }


def computed_table(digits: int = TABLE_DIGITS) -> bytes:
    """The entries ``k < digits``, ``d = 1..15`` computed from scratch, as shipped.

    What ``python -m torchdefer.rng._x_powers`` writes and the tests compare
    the shipped file with; never reads the shipped file.
    """
    table: dict[tuple[int, int], int] = {}
    return b"".join(
        _compute(k, d, table).to_bytes(ENTRY_BYTES, "little")
        for k in range(digits)
        for d in range(1, 16)
    )


def _compute(k: int, d: int, table: dict[tuple[int, int], int]) -> int:
    """``x**(d * 16**k * 2**15) mod P`` from ``table``'s smaller entries; kept in ``table``."""
    found = table.get((k, d))
    if found is not None:
        return found
    if d == 1:
        if k == 0:
            value = reduce(1 << (1 << _LOW_BITS))
        else:
            value = _compute(k - 1, 1, table)
            for _ in range(4):
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
    r = reduce(1 << (n & ((1 << _LOW_BITS) - 1)))
    high, k = n >> _LOW_BITS, 0
    while high:
        digit = high & 15
        if digit:
            r = _mulmod(r, _entry(k, digit))
        high >>= 4
        k += 1
    return r
