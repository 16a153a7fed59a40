"""The shipped table of jump polynomials is exactly what gf2 computes, and powers
assembled from it are the powers of x."""

from __future__ import annotations

from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_mt19937 import schoolbook_mod

from torchdefer.errors import InternalError
from torchdefer.rng import _gf2 as gf2


def test_shipped_table_is_the_computed_table():
    shipped = resources.files("torchdefer.rng").joinpath("_x_powers.bin").read_bytes()
    assert shipped == gf2.computed_table()


def test_shipped_table_is_read_whole():
    raw = gf2._shipped_raw()
    assert raw is not None and len(raw) == (gf2.TABLE_DIGITS * 255 + 1) * gf2.ENTRY_BYTES
    assert gf2._entry(0, 1) == gf2.reduce(1 << (1 << 15))
    assert gf2._barrett_value() == gf2.barrett_constant()


def test_a_wrong_shipped_barrett_constant_refuses_to_write_a_table(monkeypatch):
    monkeypatch.setattr(gf2, "_barrett_value", lambda: gf2.barrett_constant() ^ 1)
    with pytest.raises(InternalError, match="wrong Barrett constant"):
        gf2.computed_table(digits=1)


def test_powers_from_the_table_agree_with_products_of_smaller_powers():
    # n spans every shipped digit and one beyond (computed, not shipped).
    n = (1 << (15 + gf2.DIGIT_BITS * gf2.TABLE_DIGITS + 3)) + 0xABCDEF123457
    a = n // 3
    product = gf2.reduce(gf2.clmul(gf2.x_power_mod(a), gf2.x_power_mod(n - a)))
    assert product == gf2.x_power_mod(n)


def _square_and_multiply(n: int) -> int:
    """x**n mod P by squarings and shifts with schoolbook reduction: no FFT, no table."""
    r = 1
    for bit in bin(n)[2:]:
        r = schoolbook_mod(gf2._square(r))
        if bit == "1":
            r = schoolbook_mod(r << 1)
    return r


@pytest.mark.parametrize(
    "n",
    [
        gf2.DEGREE,  # the first power that needs a reduction
        (1 << 15) - 1,  # low bits only, above DEGREE: two reductions
        1 << 15,  # one entry, no low bits
        (1 << 15) + gf2.DEGREE + 5,  # an entry, then low bits above DEGREE
        0x3BD40013F,  # the 8B torchtitan model's jump
        0xF0000F0000,  # digits with runs of zeros between them
        (0xFF00FF << 15) | 0x4E21,  # digits 255, 0, 255; low bits above DEGREE
        (1 << 47) | 0x5A5A5A5A5A7F,  # beyond the shipped digits
    ],
)
def test_x_power_mod_is_the_power_of_x(n):
    assert gf2.x_power_mod.__wrapped__(n) == _square_and_multiply(n)


@settings(max_examples=12, deadline=None)
@given(st.integers(min_value=0, max_value=1 << 50))
def test_any_power_below_2_to_the_50_is_the_power_of_x(n):
    assert gf2.x_power_mod.__wrapped__(n) == _square_and_multiply(n)


def test_without_the_shipped_file_powers_are_computed_alike(monkeypatch):
    # A missing or wrong-sized file: entries and the Barrett constant computed.
    monkeypatch.setattr(gf2, "_shipped_raw", lambda: None)
    monkeypatch.setattr(gf2, "_table", {})
    gf2._barrett_value.cache_clear()
    gf2._barrett.cache_clear()
    try:
        n = (0xFF01 << 15) | 0x1234
        assert gf2.x_power_mod.__wrapped__(n) == _square_and_multiply(n)
    finally:
        gf2._barrett_value.cache_clear()
        gf2._barrett.cache_clear()
