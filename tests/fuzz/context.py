"""What an instruction maker sees: the eager namespace so far, a seeded RNG, helpers."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

__all__ = ["FLOATS", "SHAPES", "Ctx", "with_no_grad"]

# Small (<16) and large (>=16, some not a multiple of 16) element counts: the
# CPU normal kernel draws differently below and above 16 and for the tail.
SHAPES = ["(4, 6)", "(3, 5)", "(24,)", "(2, 3, 4)", "(6,)", "(17,)", "(5, 7)", "(37,)",
          "(4, 4)", "(3,)", "(2, 16)", "(3, 11)", "(1, 5)"]
FLOATS = ["torch.float32", "torch.float64", "torch.float16", "torch.bfloat16"]


class Ctx:
    """What a maker sees: the eager namespace so far and a seeded ``random.Random``."""

    def __init__(self, rng: random.Random, env: dict) -> None:
        self.rng = rng
        self.env = env
        self.counter = 0

    def new(self, prefix: str = "t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def names(self, prefix: str, pred: Callable[[object], bool] | None = None) -> list[str]:
        return [k for k, v in self.env.items()
                if k[:1] == prefix and k[1:].isdigit() and (pred is None or pred(v))]

    def pick(self, pred: Callable[[torch.Tensor], bool] | None = None) -> str | None:
        names = self.names("t", lambda t: isinstance(t, torch.Tensor) and (pred is None or pred(t)))
        return self.rng.choice(names) if names else None

    def pick_float(self, min_dim: int = 0) -> str | None:
        return self.pick(lambda t: t.is_floating_point() and t.dim() >= min_dim)

    def shape(self) -> str:
        return self.rng.choice(SHAPES)

    def gen(self) -> str:
        """An explicit generator half of the time."""
        return self.rng.choice(["", "", ", generator=g0", ", generator=g1"])

    def dtype_arg(self) -> str:
        return self.rng.choice(["", "", f", dtype={self.rng.choice(FLOATS)}"])

    def num(self) -> str:
        return self.rng.choice(["0.5", "-1.25", "3.0", "2", "0.1"])

    def shape_of(self, name: str) -> tuple[int, ...]:
        return tuple(self.env[name].shape)


def with_no_grad(ctx: Ctx, line: str) -> str:
    # In-place writes to leaves that require grad need no_grad, as in init code.
    return f"with torch.no_grad(): {line}" if ctx.rng.random() < 0.5 else line
