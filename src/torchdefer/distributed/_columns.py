"""Column blocks from row chunks: ``Shard(1)`` shards without building the parameter whole.

Row replay (:mod:`torchdefer.distributed._rows`) computes a *contiguous* range
of a parameter's elements from those elements alone: the ``Shard(0)`` shards of
FSDP2 and of ``ColwiseParallel``. ``RowwiseParallel`` (``Shard(1)``: a block of
columns) and the FSDP2 shard of such a block (TP+FSDP2) are not contiguous:
``distribute_tensor`` records ``chunk(dim=1)`` (a strided view of the
parameter) and ``.contiguous()`` (a ``clone`` into the local tensor's own
storage), and row replay, finding a strided read, falls back to replaying the
whole parameter (and, for ``trunc_normal_``, its scratch) on every rank.

:class:`ColumnRows` is row replay that also knows that pattern: elements of
a storage made by ``clone`` of a view that is an ``(R, C)`` block of rows of
length ``N`` (``stride (N, 1)``, after merging dimensions that are laid out
as one) are computed by running row replay on chunks of whole rows of the
parameter (about :data:`CHUNK_BYTES` each), keeping the block's columns and
dropping the rest. Memory is the shard plus one chunk; time is the draws of
the rows the shard touches (all of them for a ``Shard(1)`` shard: a column of
a row-major random tensor takes words spread over the whole stream). Values
are bit for bit the eager slice: each chunk is row replay's, which is.

The local tensor of a ``Shard(0)`` placement (``ColwiseParallel``) is a
``clone`` of a row range: its elements are the range's, computed straight into
the shard (row replay alone would compute the range, clone it and copy the
clone, three times the shard at once).

Nothing else changes: a history row replay cannot slice (``orthogonal_``, a
CUDA generator, a write after the ``clone``) still replays as recorded.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torchdefer.distributed._rows import NotSliceable, RowReplay, Span, contiguous_range
from torchdefer.recorder._graph import Storage, TensorMeta, Value

__all__ = ["CHUNK_BYTES", "ColumnRows", "block_of_rows"]

# Rows of the parameter computed at once: the scratch a column block costs.
CHUNK_BYTES = 4 << 20
_CLONE = torch.ops.aten.clone.default


def block_of_rows(meta: TensorMeta) -> tuple[int, int, int, int] | None:
    """``(R, C, N, offset)`` if ``meta`` views ``R`` runs of ``C`` consecutive elements
    ``N`` apart (``N > C``), from ``offset``, in row-major order; else None.

    >>> from torchdefer.recorder._graph import TensorMeta
    >>> import torch
    >>> block = torch.empty(6, 8)[:, 2:5]
    >>> block_of_rows(TensorMeta.of(block, block.device))
    (6, 3, 8, 2)
    """
    if meta.conj or meta.neg:
        return None
    dims = [(size, stride) for size, stride in zip(meta.size, meta.stride) if size != 1]
    if not dims:
        return None
    merged = [list(dims[-1])]
    for size, stride in reversed(dims[:-1]):  # an outer dim laid out right after the inner
        if stride == merged[0][0] * merged[0][1]:
            merged[0][0] *= size
        else:
            merged.insert(0, [size, stride])
    if len(merged) != 2 or merged[1][1] != 1 or merged[0][1] <= merged[1][0]:
        return None
    (rows, step), (columns, _) = merged
    return rows, columns, step, meta.offset


class ColumnRows(RowReplay):
    """Row replay that also computes column blocks (``Shard(1)``) from chunks of rows.

    ``chunked`` tells whether a run used it (``shard.observe`` reports it).
    """

    def __init__(self, replay: Any, targets: Any = ()) -> None:
        super().__init__(replay, targets)
        self.chunked = False

    def span(self, storage: Storage, version: int, lo: int, hi: int) -> Span:
        source = _clone_source(storage, version)
        if source is None:
            return super().span(storage, version, lo, hi)
        src, read = source
        start = contiguous_range(src.meta)
        if start is not None:  # a row range: its source's elements, computed in place
            return self._range_span(storage, lo, hi, src, read, start[0])
        if block_of_rows(src.meta) is not None:
            # Its reason, if it cannot, is the op of the parameter's history that stops it.
            return self._block_span(storage, version, lo, hi, src, read)
        return super().span(storage, version, lo, hi)

    def _range_span(self, storage: Storage, lo: int, hi: int, src: Value, read: int, start: int):
        """Elements of a clone of a contiguous range (``ColwiseParallel``'s local tensor): its
        source's span itself. Row replay would compute the source's span, clone it and
        copy the clone into place, three times the shard at once."""
        if not 0 <= lo <= hi <= math.prod(src.meta.size):
            raise NotSliceable(storage.creator, f"elements [{lo}, {hi}) are not in its storage")
        span = self.span(src.storage, read, start + lo, start + hi)
        if span.dtype != src.meta.dtype:
            raise NotSliceable(storage.creator, "reads its source as another dtype")
        return span

    def _block_span(
        self, storage: Storage, version: int, lo: int, hi: int, src: Value, read: int
    ) -> Span:
        rows, columns, step, offset = block_of_rows(src.meta)  # type: ignore[misc]
        if not 0 <= lo <= hi <= rows * columns:
            raise NotSliceable(storage.creator, f"elements [{lo}, {hi}) are not in its storage")
        first, last = lo // columns, -(-hi // columns)
        per = max(1, CHUNK_BYTES // (step * src.meta.dtype.itemsize))
        chunks = []  # (first row, rows, the span of the parameter's elements they cover)
        for a in range(first, last, per):
            b = min(last, a + per)
            part = self.span(src.storage, read, offset + a * step, offset + (b - 1) * step
                               + columns)  # fmt: skip
            if part.dtype != src.meta.dtype:
                raise NotSliceable(storage.creator, "reads its source as another dtype")
            chunks.append((a, b - a, part))
        device = self.replay.map_device(src.meta.device)
        span = Span(storage, version, lo, hi, src.meta.dtype, device)
        span.steps.append(lambda buf: self._fill(buf, chunks, columns, step, lo, hi))
        return span

    def _fill(self, buf: torch.Tensor, chunks, columns: int, step: int, lo: int, hi: int):
        self.chunked = True
        for a, n, part in chunks:
            got = part.compute().as_strided((n, columns), (step, 1))
            x, y = max(lo, a * columns), min(hi, (a + n) * columns)
            # whole rows straight into place (no copy of the block in between), then
            # the parts of the first and last rows a range may cut
            first, last = -(-x // columns), y // columns
            if first < last:
                rows = buf[first * columns - lo : last * columns - lo].view(last - first, columns)
                rows.copy_(got[first - a : last - a])
            for r in {x // columns, last} if first <= last else {x // columns}:
                s, e = max(x, r * columns), min(y, (r + 1) * columns)
                if s < e and not first <= r < last:
                    buf[s - lo : e - lo].copy_(got[r - a, s - r * columns : e - r * columns])


def _clone_source(storage: Storage, version: int) -> tuple[Value, int] | None:
    """``(view, version read)`` if ``storage`` is, at ``version``, a same-dtype ``clone`` of a
    view of another storage into contiguous memory (what ``distribute_tensor`` records
    for a ``Shard`` placement: ``.contiguous()`` of a chunk)."""
    node = storage.creator
    if version != 0 or node.op is not _CLONE or len(node.inputs) != 1:
        return None
    created = next((v for v in node.outputs if v.storage is storage), None)
    src = node.inputs[0]
    if created is None or created.meta.size != src.meta.size or src.storage is storage:
        return None
    if created.meta.dtype != src.meta.dtype or src.meta.conj or src.meta.neg:
        return None
    if contiguous_range(created.meta) != (0, math.prod(created.meta.size)):
        return None
    return src, node.reads[0]
