"""The shipped table of jump polynomials is exactly what gf2 computes."""

from __future__ import annotations

from importlib import resources

from torchdefer.rng import _gf2 as gf2


def test_shipped_table_is_the_computed_table():
    shipped = resources.files("torchdefer.rng").joinpath("_x_powers.bin").read_bytes()
    assert shipped == gf2.computed_table()


def test_shipped_table_is_read_whole():
    entries = gf2._shipped()
    assert len(entries) == gf2.TABLE_DIGITS * 15
    assert entries[(0, 1)] == gf2.reduce(1 << (1 << 15))


def test_powers_from_the_table_agree_with_products_of_smaller_powers():
    # n spans every shipped digit and one beyond (computed, not shipped).
    n = (1 << (15 + 4 * gf2.TABLE_DIGITS + 3)) + 0xABCDEF123457
    a = n // 3
    product = gf2.reduce(gf2.clmul(gf2.x_power_mod(a), gf2.x_power_mod(n - a)))
    assert product == gf2.x_power_mod(n)
