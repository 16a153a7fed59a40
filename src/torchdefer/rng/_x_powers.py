"""Write ``_x_powers.bin``, the shipped table of ``gf2``'s jump polynomials.

    python -m torchdefer.rng._x_powers

Entry ``(k, d)`` (``k < gf2.TABLE_DIGITS``, ``d = 1..255``, k-major) is
``x**(d * 256**k * 2**15) mod P`` in ``gf2.ENTRY_BYTES`` little-endian bytes;
after them, in as many bytes, the Barrett constant ``floor(x**(2 * DEGREE) / P)``.
The file is a cache of :func:`gf2.computed_table`; ``tests/rng/test_x_powers.py``
checks it is exactly that.
"""

from __future__ import annotations

from pathlib import Path

from torchdefer.rng import _gf2 as gf2

__all__ = ["main"]


def main() -> None:
    """Compute the table and write it next to ``gf2.py``."""
    path = Path(gf2.__file__).with_name("_x_powers.bin")
    path.write_bytes(gf2.computed_table())
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
