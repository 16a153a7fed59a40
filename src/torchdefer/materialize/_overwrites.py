"""Which recorded writes of a storage a later value still depends on: dead writes.

A write is dead for a version of its storage when every byte it wrote is set
again, before that version, by writes that do not read what was there
(``fill_``, ``zero_``, ``copy_`` from another storage, an in-place random op,
a rejection loop that sets every element). Such later writes may each cover
only part of the storage: ``dcp.load`` fills a sharded parameter's local
tensor through ``narrow`` views, one per saved chunk, and FSDP2's padded
shard keeps padding no load writes. Hugging Face models initialise every
weight twice (the layer's own ``kaiming_uniform_``, then ``_init_weights``'
``normal_``); with exact generator positions a dead random init is skipped,
not only its values: later draws are placed by jump-ahead.

The walk goes from the newest write back, keeping the byte ranges set
regardless by the writes after the one looked at. A write that reads the
storage (``add_``, a copy from elsewhere in it) takes the bytes it reads out
of that set; a write whose bytes are not known (``set_``, ``resize_``, an
``out=`` argument, several storages at once) empties it and is kept.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import torch

from torchdefer.recorder._graph import Node, NodeKind, Storage, TensorMeta, Value
from torchdefer.recorder._rng_placement import meta_call

__all__ = ["COPY", "FILLS", "Ranges", "live_writers", "sets_regardless", "writes_first_argument",
           "writes_in_place"]

# In-place ops that set every element they write whatever its value was.
FILLS = frozenset(
    {torch.ops.aten.fill_.Scalar, torch.ops.aten.fill_.Tensor, torch.ops.aten.zero_.default}
)
COPY = torch.ops.aten.copy_.default
_aten = torch.ops.aten
# In-place random ops whose elements do not depend on what they overwrite (a
# list, not the schema: rrelu_with_noise_ also writes its first argument).
_RANDOM_FILLS = frozenset(
    {_aten.uniform_, _aten.normal_, _aten.bernoulli_, _aten.cauchy_, _aten.exponential_,
     _aten.geometric_, _aten.log_normal_, _aten.random_}
)


def writes_first_argument(op: Any) -> bool:
    """Whether ``op``'s schema says it writes its first argument (``Tensor(a!) self``)."""
    schema = getattr(op, "_schema", None)
    first = schema.arguments[0].alias_info if schema is not None and schema.arguments else None
    return first is not None and first.is_write


def writes_in_place(node: Node) -> bool:
    """An in-place node whose first argument is the one tensor it writes and returns,
    with its layout unchanged (not ``t_``, ``set_``, ``resize_``)."""
    if len(node.writes) != 1 or len(node.outputs) != 1 or not node.leaves:
        return False
    first, out = node.leaves[0], node.outputs[0]
    return (
        isinstance(first, Value)
        and first.storage is node.writes[0][0]
        and out.storage is first.storage
        and out.meta == first.meta
    )


def sets_regardless(node: Node) -> bool:
    """Whether in-place ``node`` sets the elements of its first argument without reading
    them (other arguments it reads are the caller's to account for)."""
    if node.kind == NodeKind.RANDOM:
        if getattr(node.op, "overloadpacket", None) in _RANDOM_FILLS:
            return True
        # A rejection loop (trunc_normal_) sets every element too (rng.rejection).
        hook = getattr(node.op, "rows", None)
        return hook is not None and node.rng is not None and _loop_of(node, hook) is not None
    if node.op in FILLS:
        return True
    return node.op is COPY


def _loop_of(node: Node, hook: Any) -> Any:
    args, kwargs, _ = meta_call(node)
    return hook(*args, **kwargs)


class Ranges:
    """A set of half-open integer ranges, kept sorted and disjoint."""

    __slots__ = ("_spans",)

    def __init__(self) -> None:
        self._spans: list[tuple[int, int]] = []

    def covers(self, lo: int, hi: int) -> bool:
        if lo >= hi:
            return True
        return any(a <= lo and hi <= b for a, b in self._spans)

    def add(self, lo: int, hi: int) -> None:
        if lo >= hi:
            return
        kept = []
        for a, b in self._spans:
            if b < lo or hi < a:
                kept.append((a, b))
            else:
                lo, hi = min(lo, a), max(hi, b)
        kept.append((lo, hi))
        self._spans = sorted(kept)

    def remove(self, lo: int, hi: int) -> None:
        if lo >= hi:
            return
        kept = []
        for a, b in self._spans:
            if a < lo:
                kept.append((a, min(b, lo)))
            if hi < b:
                kept.append((max(a, hi), b))
        self._spans = kept

    def clear(self) -> None:
        self._spans = []

    def add_sorted(self, spans: list[tuple[int, int]]) -> None:
        """Add many disjoint ranges, sorted by start, in one merge."""
        merged: list[tuple[int, int]] = []
        for lo, hi in heapq.merge(self._spans, spans):
            if merged and lo <= merged[-1][1]:
                if hi > merged[-1][1]:
                    merged[-1] = (merged[-1][0], hi)
            else:
                merged.append((lo, hi))
        self._spans = merged


def live_writers(storage: Storage, version: int) -> tuple[list[int], bool]:
    """Indices of ``storage.writers`` before ``version`` that the storage's contents at
    ``version`` depend on (newest first; the others are dead, see the module
    docstring), and whether some of its creator's elements show through."""
    live: list[int] = []
    covered = Ranges()  # bytes set regardless by the live writes after the one looked at
    everything = max([storage.nbytes, *(before for _, before in storage.grown)])
    for i in range(version - 1, -1, -1):
        node = storage.writers[i]
        written = _written_bytes(node, storage)
        if written is not None and covered.covers(*written):
            continue  # every byte it wrote is set again before anyone reads it
        live.append(i)
        if written is None:
            covered.clear()
            continue
        regardless = sets_regardless(node)
        if regardless:
            runs = byte_runs(node.leaves[0].meta)
            if runs is not None:
                covered.add_sorted(runs)
        # What it reads of the storage must come from the writes before it.
        for k, leaf in enumerate(node.leaves):
            if isinstance(leaf, Value) and leaf.storage is storage and (k or not regardless):
                covered.remove(*byte_extent(leaf.meta))
        if covered.covers(0, everything):
            return live, False  # the writes before, and the creator's elements, are dead
    return live, not covered.covers(0, everything)


def _written_bytes(node: Node, storage: Storage) -> tuple[int, int] | None:
    """The bytes of ``storage`` that ``node`` may write, if it writes only through its
    first argument (else None: unknown)."""
    if not writes_in_place(node) or node.writes[0][0] is not storage:
        return None
    return byte_extent(node.leaves[0].meta)


def byte_extent(meta: TensorMeta) -> tuple[int, int]:
    """``[lo, hi)``: the bytes of its storage a tensor laid out as ``meta`` can touch."""
    itemsize = meta.dtype.itemsize
    if 0 in meta.size:
        return meta.offset * itemsize, meta.offset * itemsize
    extent = 1 + sum((n - 1) * s for n, s in zip(meta.size, meta.stride))
    return meta.offset * itemsize, (meta.offset + extent) * itemsize


# A view of more runs than this is not counted as covering (kept alive instead).
_MAX_RUNS = 1 << 16


def byte_runs(meta: TensorMeta) -> list[tuple[int, int]] | None:
    """The bytes a tensor laid out as ``meta`` consists of, as sorted disjoint runs,
    or None if its elements overlap (or it is too scattered to list).

    A column block of a row-major matrix (``w[:, a:b]``: what ``dcp.load`` writes
    into a row shard from a column-sharded checkpoint) is one run per row.
    """
    itemsize = meta.dtype.itemsize
    if 0 in meta.size:
        return []
    dims = sorted((st, n) for n, st in zip(meta.size, meta.stride) if n > 1)
    run = 1  # elements of the innermost contiguous block
    while dims and dims[0][0] == run:
        run *= dims.pop(0)[1]
    count = math.prod(n for _, n in dims)
    if count > _MAX_RUNS:
        return None
    # Internal tensors name their device: the user's default may be cuda or meta.
    starts = torch.zeros(1, dtype=torch.int64, device="cpu")
    for st, n in dims:
        steps = torch.arange(n, dtype=torch.int64, device="cpu") * st
        starts = (starts[:, None] + steps).reshape(-1)
    starts = (starts.sort().values + meta.offset) * itemsize
    length = run * itemsize
    if count > 1 and bool((starts[1:] - starts[:-1] < length).any()):
        return None  # elements overlap (an expanded view): it writes some bytes twice
    return [(lo, lo + length) for lo in starts.tolist()]
