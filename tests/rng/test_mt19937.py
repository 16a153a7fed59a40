"""Jumping the CPU generator ahead lands exactly where drawing the numbers lands."""

import random

import pytest
import torch

from torchdefer.rng import _gf2 as gf2
from torchdefer.rng import mt19937


def _drawn_state(seed: int, warmup: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if warmup:
        torch.empty(warmup, dtype=torch.int32).random_(generator=g)
    return g.get_state()


def _berlekamp_massey(bits: list[int]) -> int:
    """The connection polynomial of a GF(2) sequence (bit i = coefficient of x**i)."""
    c, b, length, m, window = 1, 1, 0, 1, 0
    for n, bit in enumerate(bits):
        window = (window << 1) | bit
        if (c & window).bit_count() & 1 == 0:
            m += 1
        elif 2 * length <= n:
            c, b, length, m = c ^ (b << m), c, n + 1 - length, 1
        else:
            c ^= b << m
            m += 1
    return int(bin(c)[2:].zfill(length + 1)[::-1], 2)


def test_the_characteristic_polynomial_is_the_generators_own():
    state = _drawn_state(12345, 0)
    # From w[1] on: the low 31 bits of w[0] are not part of the 19937-bit state.
    words = mt19937._sequence(mt19937.array_of(state), 70)[1:]
    for bit in (0, 17, 31):
        sequence = ((words >> bit) & 1).tolist()[: 2 * gf2.DEGREE + 50]
        assert _berlekamp_massey(sequence) == gf2.P


def schoolbook_mod(r: int) -> int:
    """``r mod P`` by long division, bit by bit (no FFT, no Barrett constant)."""
    while r.bit_length() > gf2.DEGREE:
        r ^= gf2.P << (r.bit_length() - 1 - gf2.DEGREE)
    return r


def test_barrett_reduction_and_products_match_schoolbook_arithmetic():
    rng = random.Random(1)

    def schoolbook_mul(a, b):
        out = 0
        while b:
            low = b & -b
            out ^= a << (low.bit_length() - 1)
            b ^= low
        return out

    for _ in range(3):
        a, b = rng.getrandbits(gf2.DEGREE), rng.getrandbits(gf2.DEGREE)
        assert gf2.clmul(a, b) == schoolbook_mul(a, b)
        r = rng.getrandbits(2 * gf2.DEGREE - 1)
        assert gf2.reduce(r) == schoolbook_mod(r)
    assert gf2.x_power_mod(45678) == schoolbook_mod(1 << 45678)
    a, b = 123456789, 98765432123
    product = gf2.reduce(gf2.clmul(gf2.x_power_mod(a), gf2.x_power_mod(b)))
    assert product == gf2.x_power_mod(a + b)


def test_the_state_layout_of_this_torch_is_understood():
    assert mt19937.layout_known()


@pytest.mark.parametrize("warmup", [0, 1, 623, 624, 1000])
@pytest.mark.parametrize("words", [0, 1, 5, 623, 624, 625, 100_000, 2_000_003])
def test_a_jump_of_any_length_equals_drawing_the_words(monkeypatch, warmup, words):
    state = _drawn_state(7 + warmup, warmup)
    expected = mt19937._draw(state, words)
    monkeypatch.setattr(mt19937, "_DRAW_LIMIT", 0)  # force the polynomial jump
    assert torch.equal(mt19937.advance(state, words), expected)


def test_a_long_jump_keeps_the_cached_normal_samples():
    g = torch.Generator().manual_seed(3)
    torch.empty(3, dtype=torch.float64).normal_(generator=g)  # leaves a cached sample
    state = g.get_state()
    jumped = mt19937.advance(state, 9_000_001)
    assert torch.equal(jumped[5016:], state[5016:])
    assert torch.equal(jumped, mt19937._draw(state, 9_000_001))


def test_a_negative_jump_is_refused():
    with pytest.raises(ValueError, match="cannot move a generator back"):
        mt19937.advance(_drawn_state(0, 0), -1)
