"""The output strides TensorIterator gives a fresh elementwise output (ATen's rule).

``TensorIteratorBase::build`` (aten/src/ATen/TensorIterator.cpp) lays out an
output it allocates from its inputs: when all have the output's shape, a
contiguous output if they all are contiguous, else channels-last if they all
are, else their strides if they are all non-overlapping and dense with the
same strides; otherwise (``compute_strides``, ``reorder_dimensions``,
``allocate_or_resize_outputs``) the dimensions sorted by the inputs' strides,
broadcast dimensions (stride 0) skipped, ties broken by size, the first input
deciding first. Used for the few ops whose Python meta kernels lay out
otherwise in more than size-1 dimensions (``fake/_layout.py``).
"""

from __future__ import annotations

__all__ = ["iterator_strides", "non_overlapping_and_dense"]

Layout = tuple[tuple[int, ...], tuple[int, ...]]  # (sizes, strides)


def iterator_strides(inputs: list[Layout], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of the output of ``shape`` TensorIterator allocates for ``inputs``
    (in operand order; a 0-d tensor, a wrapped scalar included)."""
    ndim = len(shape)
    if ndim == 0:
        return ()
    if inputs and all(size == shape for size, _ in inputs):
        fast = _fast_setup(inputs, shape)
        if fast is not None:
            return fast
    if ndim == 1:
        return (1,)
    strides = [_broadcast_strides(size, stride, shape) for size, stride in inputs]
    perm = _reordered(strides, shape)
    if perm == list(reversed(range(ndim))):
        return _contiguous(shape)
    out, step = [0] * ndim, 1
    for d in perm:  # fastest first
        out[d] = step
        step *= shape[d]
    return tuple(out)


def _fast_setup(inputs: list[Layout], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    if all(_contiguous_like(size, stride, range(len(size) - 1, -1, -1))
           for size, stride in inputs):
        return _contiguous(shape)
    if len(shape) == 4 and all(_contiguous_like(size, stride, (1, 3, 2, 0))
                               for size, stride in inputs):
        _, c, h, w = (max(x, 1) for x in shape)
        return (c * h * w, 1, w * c, c)
    first = inputs[-1][1]
    if all(non_overlapping_and_dense(size, stride) and stride == first for size, stride in inputs):
        return first
    return None


def _contiguous_like(size: tuple[int, ...], stride: tuple[int, ...], order) -> bool:
    """c10's contiguity for a memory format: ``order`` innermost first, size-1 skipped."""
    if 0 in size and list(order) == list(range(len(size) - 1, -1, -1)):
        return True  # an empty tensor is contiguous
    expected = 1
    for d in order:
        if size[d] != 1:
            if stride[d] != expected:
                return False
            expected *= size[d]
    return True


def non_overlapping_and_dense(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """``Tensor.is_non_overlapping_and_dense`` (not public): a permuted contiguous layout."""
    expected = 1
    for st, n in sorted((st, n) for n, st in zip(size, stride) if n != 1):
        if st != expected:
            return False
        expected *= n
    return True


def _broadcast_strides(size, stride, shape) -> list[int]:
    row = [0] * len(shape)
    offset = len(shape) - len(size)
    for i, (n, st) in enumerate(zip(size, stride)):
        row[offset + i] = 0 if n == 1 and shape[offset + i] != 1 else st
    return row


def _reordered(strides: list[list[int]], shape: tuple[int, ...]) -> list[int]:
    """``reorder_dimensions``: the dimensions, fastest first (an insertion sort
    that leaves ambiguous pairs in place)."""

    def should_swap(d0: int, d1: int) -> int:
        for row in strides:
            s0, s1 = row[d0], row[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(reversed(range(len(shape))))
    for i in range(1, len(shape)):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            order = should_swap(perm[d0], perm[d1])
            if order > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif order < 0:
                break
    return perm


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        out[d] = step
        step *= max(shape[d], 1)
    return tuple(out)
