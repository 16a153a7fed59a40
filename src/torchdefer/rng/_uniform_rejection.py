"""How far ``trunc_normal_``'s uniform loop moves the CPU generator, in bounded scratch memory.

torch >= 2.12's ``_no_grad_trunc_normal_`` takes this branch when ``[a, b]``
holds at most 30% of the normal's mass (``p <= 0.3``). A round draws two
whole-tensor ``uniform_`` calls: candidates in ``[a, b]``, then acceptance
uniforms ``u`` in ``[0, 1)``; an element still waiting takes its candidate
``x`` and stays waiting while ``log(u) > -0.5 ((x - mean) / std)**2 - log_peak``
(every op in the tensor's dtype). The loop ends after the first round with no
element waiting. CPU ``uniform_`` is a serial kernel (element ``i`` of a
contiguous tensor takes the call's words ``i*w .. i*w + w``), so element
``i``'s fate in round ``k`` depends on its own two draws only: the rounds are
learnt chunk by chunk, keeping only the indices still waiting, and later
rounds draw only the chunks holding one (:class:`UniformRejection`).

The obstacle is the acceptance test's arithmetic. Eager computes each
elementwise op either in TensorIterator's vectorized loop or in its scalar
tail, and which elements land in a tail depends on the intra-op thread split;
``log_`` goes through ``vml`` (MKL's ``vsLn``/``vdLn`` where torch has MKL,
Sleef otherwise) on whatever contiguous run it is handed. Where two paths
round one element differently, a chunked computation could decide it
differently from eager. So every decision is computed along both paths: the
vectorized one (a contiguous buffer padded to a multiple of 128 elements, on
one thread, so no element falls in a tail) and the scalar one (a strided view:
``basic_loop`` for the elementwise ops, ``log_``'s buffered ``vml`` call on
other runs and alignments). Where the density has the same bits along both
after every op (an element may take one loop in one op and the other in the
next) and both ``log`` values fall on the same side of it, for every element
concerned, the decision does not depend on the path and is eager's. Where not
(a value within an ulp of the test, or a NaN), :meth:`UniformRejection.end`
answers None and the caller runs the call whole, as eager does.

The premises (the draw model's ``w`` words an element, chunks equal to a
whole ``uniform_``, the loop as read here) are checked against torch's own
function once per dtype (:func:`premises_hold`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from torchdefer.errors import InternalError
from torchdefer.rng import mt19937

__all__ = ["CHUNK", "UniformRejection", "premises_hold"]

CHUNK = 215040  # elements drawn at a time (0.8 MiB of float32 per buffer): see _padded
_PAD = 128  # a multiple of every vector loop's step (2 vectors of 64 bytes, 1-byte dtypes)
_GRAIN = 32768  # at::internal::GRAIN_SIZE: TensorIterator runs fewer elements serially


def _per_element(dtype: torch.dtype) -> int:
    return 2 if dtype == torch.float64 else 1  # uniform_real_distribution: random64 for double


@dataclass(frozen=True, slots=True)
class UniformRejection:
    """The uniform loop of ``trunc_normal_(mean, std, a, b)`` on ``n`` elements.

    Elements are counted by position in the draw order: a strided tensor's
    TensorIterator order, in which both its candidates and the acceptance
    uniforms of its ``empty_like`` are drawn (the dimension order is kept), and
    in which the arithmetic runs on dense buffers (``in_order``: a contiguous
    tensor, whose positions are its elements' indices).

    ``words`` is what one whole-tensor ``uniform_`` draws (the draw model's);
    a round draws twice that.
    """

    n: int
    dtype: torch.dtype
    mean: float
    std: float
    a: float
    b: float
    words: int
    in_order: bool = True  # positions are the elements' indices (else: rows gives None)

    @property
    def log_peak(self) -> float:
        mode = max(self.a, min(self.mean, self.b))  # as torch computes it, in Python floats
        return -0.5 * ((mode - self.mean) / self.std) ** 2

    def end(self, state: torch.Tensor, chunk: int | None = None) -> torch.Tensor | None:
        """The generator state after the loop, started from ``state``; None where a
        decision depends on the kernels' path (run the call whole instead)."""
        waiting: torch.Tensor | None = None  # sorted indices still waiting; None: all
        while waiting is None or waiting.numel():
            kept = []
            for first, _, accepted, indices in self._round(state, waiting, 0, self.n, chunk):
                if accepted is None:
                    return None
                kept.append(_still_waiting(accepted, first, indices))
            state = mt19937.advance(state, 2 * self.words)
            waiting = _joined(kept)
        return state

    def rows(
        self, s: int, e: int, out: torch.Tensor, state_at: Callable[[int], torch.Tensor],
        chunk: int | None = None,
    ) -> int | None:
        """The final values of elements ``[s, e)`` into ``out``; returns elements drawn,
        or None where a decision depends on the kernels' path (``out`` is then partial).

        ``state_at(words)`` is the generator state ``words`` past the loop's first
        word. Later rounds draw only the chunks holding an element of the range
        still waiting, and stop when the range is done: a row shard pays its own
        rounds only.
        """
        if not self.in_order:
            return None
        waiting: torch.Tensor | None = None
        drawn, round_word = 0, 0
        while waiting is None or waiting.numel():
            kept = []
            for first, values, accepted, indices in self._round(
                state_at(round_word), waiting, s, e, chunk
            ):
                if accepted is None:
                    return None
                drawn += 2 * values.numel()
                if indices is None:
                    out[first - s : first - s + values.numel()] = values
                else:  # a waiting element takes its new candidate, accepted or not
                    out[indices - s] = values
                kept.append(_still_waiting(accepted, first, indices))
            waiting = _joined(kept)
            round_word += 2 * self.words
        return drawn

    def _round(
        self,
        state: torch.Tensor,
        waiting: torch.Tensor | None,
        lo: int,
        hi: int,
        chunk: int | None,
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
        """(first, candidates, accepted, indices) per chunk of ``[lo, hi)`` drawn this round.

        Only chunks holding a waiting index are drawn (all in the first round,
        where ``waiting`` is None); then ``candidates`` and ``accepted`` are
        those of ``indices``, else of the chunk's elements from ``first``.
        ``accepted`` is None where the decision depends on the path.
        """
        chunk, per = chunk or CHUNK, _per_element(self.dtype)
        candidates, accepts = torch.Generator(device="cpu"), torch.Generator(device="cpu")
        buffers = [torch.empty(min(chunk, hi - lo), dtype=self.dtype) for _ in range(2)]
        at: int | None = None  # the element both generators stand at
        for first in range(lo, hi, chunk):
            last = min(first + chunk, hi)
            indices = None if waiting is None else _between(waiting, first, last)
            if indices is not None and indices.numel() == 0:
                continue
            if at != first:
                candidates.set_state(mt19937.advance(state, first * per))
                accepts.set_state(mt19937.advance(state, self.words + first * per))
            x = buffers[0][: last - first].uniform_(self.a, self.b, generator=candidates)
            u = buffers[1][: last - first].uniform_(generator=accepts)
            at = last
            if indices is not None:  # only the waiting elements' fate matters
                x, u = x[indices - first], u[indices - first]
            yield first, x, self._accepted(x, u), indices

    def _accepted(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor | None:
        """Whether each candidate is accepted, the same along every path; else None."""
        if x.numel() == 0:
            return torch.zeros(0, dtype=torch.bool)
        density = self._density(x)
        if density is None:
            return None
        lv, ls = _vectorized(u, torch.Tensor.log_), _scalar(u, torch.Tensor.log_)
        waits = torch.minimum(lv, ls) > density  # along either path: log(u) > density
        accepted = torch.maximum(lv, ls) <= density  # along neither
        if not bool((waits | accepted).all()):
            return None
        return accepted

    def _density(self, x: torch.Tensor) -> torch.Tensor | None:
        """Eager's ``-0.5 * ((x - mean) / std)**2 - log_peak``, op for op in the dtype;
        None where an op's vectorized and scalar loops differ for some element.

        Compared after every op, not only at the end: an element may take the
        vectorized loop in one op and the scalar one in the next (each op splits
        the tensor over threads on its own), which could make a third value.
        """
        peak, mean, std = self.log_peak, self.mean, self.std
        stages: tuple[Callable[[torch.Tensor], torch.Tensor], ...] = (
            lambda t: t.sub_(mean), lambda t: t.div_(std), lambda t: t.pow_(2),
            lambda t: t.mul_(-0.5), lambda t: t.sub_(peak),
        )
        padded, vector = _vector_copy(x)
        scalar = _scalar_copy(x)
        for stage in stages:
            stage(padded)
            stage(scalar)
            if not torch.equal(vector, scalar):
                return None
        return vector


def _vector_copy(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded contiguous copy of ``values`` (whole vector steps on every thread: see
    :func:`_padded`), and the view of its first ``values.numel()`` elements."""
    k = values.numel()
    padded = torch.empty(_padded(k), dtype=values.dtype)
    padded[:k] = values
    padded[k:] = values[0]
    return padded, padded[:k]


def _scalar_copy(values: torch.Tensor) -> torch.Tensor:
    """A copy of ``values`` laid out with stride 2: elementwise ops take their scalar loop."""
    strided = torch.empty(2 * values.numel(), dtype=values.dtype)[::2]
    return strided.copy_(values)


def _vectorized(values: torch.Tensor, op: Callable[[torch.Tensor], object]) -> torch.Tensor:
    """``op`` in place on a copy of ``values`` along TensorIterator's vectorized loop only."""
    padded, view = _vector_copy(values)
    op(padded)
    return view


def _scalar(values: torch.Tensor, op: Callable[[torch.Tensor], object]) -> torch.Tensor:
    """``op`` in place on a copy of ``values`` laid out with stride 2 (scalar loops)."""
    strided = _scalar_copy(values)
    op(strided)
    return strided


def _padded(k: int) -> int:
    """A length whose every piece a thread gets is a multiple of :data:`_PAD`.

    Under :data:`_GRAIN` elements TensorIterator runs serially. Above, OpenMP's
    ``parallel_for`` gives ``m / min(T, ceil(m / _GRAIN))`` elements a thread,
    and the native backend ``max(_GRAIN, ceil(m / T))``: with ``m = 128 * 840 * j``
    (840 = lcm(1..8); ``j`` 1 or 2, so at most 7 pieces) both are multiples of
    128 for any thread count T. A tail piece would run in the scalar loop.
    """
    m = -(-k // _PAD) * _PAD
    if m < _GRAIN:
        return m
    split = _PAD * 840
    if k > 2 * split:
        raise InternalError(f"{k} elements to pad: more than a chunk ({CHUNK}); this is a bug "
                            "in torchdefer, please report it")
    return -(-k // split) * split


def _still_waiting(
    accepted: torch.Tensor, first: int, indices: torch.Tensor | None
) -> torch.Tensor:
    if indices is None:
        return (~accepted).nonzero().reshape(-1) + first
    return indices[~accepted]


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


def _between(indices: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The sorted ``indices`` in ``[lo, hi)``."""
    bounds = torch.tensor([lo, hi], dtype=torch.int64, device="cpu")
    a, b = torch.searchsorted(indices, bounds).tolist()
    return indices[a:b]


# Windows holding under 30% of the mass, chosen so that the loops run several
# rounds; sizes around the vector widths, 1 and 0.
_CHECKS = ((0.0, 1.0, -0.3, 0.3), (0.5, 0.2, 0.45, 0.6), (0.0, 1.0, 0.8, 2.5))
_SIZES = (0, 1, 15, 50, 211)


@functools.cache
def premises_hold(
    dtype: torch.dtype, run: Callable[..., object], words_of: Callable[[int], int | None]
) -> bool:
    """Whether stepping and rows give torch's own loop ``run`` (checked once per dtype).

    ``run(tensor, mean, std, a, b, generator=)`` is torch's function;
    ``words_of(n)`` the draw model's words of ``uniform_`` on ``n`` elements,
    which must be ``n`` per element (serial). Runs on real CPU tensors and
    private generators.
    """
    for n in _SIZES:
        words = words_of(n)
        if words != n * _per_element(dtype):
            return False
        for seed, (mean, std, a, b) in enumerate(_CHECKS):
            generator = torch.Generator(device="cpu").manual_seed(seed * 1000 + n)
            start = generator.get_state()
            whole = torch.empty(n, dtype=dtype, device="cpu")
            with torch.no_grad():
                run(whole, mean, std, a, b, generator=generator)
            loop = UniformRejection(n, dtype, mean, std, a, b, words)
            if not _same(loop.end(start, chunk=32), generator.get_state()):
                return False
            for s, e in ((0, n), (n // 3, n), (n // 2, n // 2 + 7)):
                part = torch.empty(max(0, min(e, n) - s), dtype=dtype, device="cpu")
                got = loop.rows(s, min(e, n), part, functools.partial(mt19937.advance, start), 32)
                if got is None or not torch.equal(part, whole[s : min(e, n)]):
                    return False
    return True


def _same(got: torch.Tensor | None, want: torch.Tensor) -> bool:
    return got is not None and torch.equal(got, want)
