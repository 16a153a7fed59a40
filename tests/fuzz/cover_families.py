"""Writes that cover a tensor piece by piece (issue 24, class 6): one family, ``cover``.

``dcp.load`` into a deferred sharded model copies each saved chunk into a
slice of the shard; replay skips the init those copies hide together
(``materialize/_overwrites.py``). A line here makes a fresh tensor (empty, or
random: a factory replay may only allocate), maybe initializes it, then
writes it in pieces: a split of its elements (rows, a flat range, pieces
that overlap or leave a gap), each piece set by a copy from outside or from
elsewhere in the tensor, a fill, a random init, or arithmetic that reads it;
sometimes a strided piece or a write through another dtype. A view taken
before the writes is kept, so a program may read it afterwards.
"""

from __future__ import annotations

import itertools

from context import Ctx

__all__ = ["cover"]

_EMPTY = "torch.empty({n})"  # uninitialized: only covered whole by pure writes
_MAKERS = [_EMPTY, "torch.randn({n})", "torch.zeros({n})", "torch.rand({n}{gen})",
           "torch.empty({n}).normal_()", "torch.empty({n}).uniform_(-1, 1{gen})"]
_SETS = [  # writes that do not read what they overwrite
    "{p}.copy_(torch.full_like({p}, {num}))", "{p}.copy_(ext[:1].expand({p}.shape))",
    "{p}.fill_({num})", "{p}.zero_()", "{p}.normal_({gen0})", "{p}.uniform_(-2, 2{gen})",
    "{p}.bernoulli_(0.5{gen})",
]
_READS = ["{p}.add_(1)", "{p}.mul_({num})"]


def cover(ctx: Ctx) -> str | None:
    rng = ctx.rng
    t, v = ctx.new(), ctx.new()
    rows, cols = rng.randint(2, 9), rng.randint(1, 6)
    n = rows * cols
    gen = ctx.gen()
    maker = rng.choice(_MAKERS)
    uninit = maker == _EMPTY  # never read what eager leaves uninitialized
    lines = [f"{t} = " + maker.format(n=f"{rows}, {cols}", gen=gen)]
    lines.append(f"{v} = {t}[{rng.randrange(rows)}]")  # a view taken before the writes
    flat = rng.random() < 0.4
    size = n if flat else rows
    cuts = sorted({0, size, *(rng.randint(0, size) for _ in range(rng.randint(1, 3)))})
    pieces = [(a, b) for a, b in itertools.pairwise(cuts) if a < b]
    if rng.random() < 0.2 and len(pieces) > 1 and not uninit:  # a gap: the init shows
        pieces.pop(rng.randrange(len(pieces)))
    if rng.random() < 0.3 and pieces:  # an overlap
        a, b = pieces[rng.randrange(len(pieces))]
        pieces.append((max(0, a - 1), min(size, b + 1)))
    rng.shuffle(pieces)
    for a, b in pieces:
        piece = f"{t}.view(-1)[{a}:{b}]" if flat else f"{t}[{a}:{b}]"
        lines.append(_write(ctx, piece, t, reads=not uninit))
    if rng.random() < 0.15:
        lines.append(f"{t}.view(-1)[::2].fill_({ctx.num()})")  # strided: covers nothing
    if rng.random() < 0.1:
        lines.append(f"{t}.view(torch.int32).zero_()")  # every byte, through another dtype
    return "; ".join(lines)


def _write(ctx: Ctx, piece: str, t: str, reads: bool) -> str:
    rng = ctx.rng
    if reads and rng.random() < 0.15:  # read another part of the same tensor
        return f"{piece}.copy_({t}.view(-1).flip(0)[:{piece}.numel()].view_as({piece}))"
    gen = ctx.gen()
    return rng.choice(_SETS + _READS if reads else _SETS).format(
        p=piece, num=ctx.num(), gen=gen, gen0=gen.lstrip(", "))
