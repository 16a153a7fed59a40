"""Row replay: a value that is a contiguous part of a storage, computed from just that part.

A local shard's history is the full parameter's factory and init ops, a
slice of it (``split``/``chunk``/``narrow`` along dim 0: a contiguous range of
the parameter's elements), and a copy into the shard's own storage. Replaying
that graph as recorded builds the whole parameter. :class:`RowReplay` is the
``substitute`` hook of :func:`~torchdefer.materialize._plan.make_plan` that
computes such a value from its own elements instead: a *span* (elements
``[lo, hi)`` of one storage at one version) is built by

* its storage's creator on the span only: a constant factory (``empty``,
  ``zeros``, ``new_zeros``, ``full`` ...), a random factory (``randn``,
  ``rand``, ``randint``), a constant, or an elementwise op (``_to_copy``,
  ``clone``, a pointwise op) of spans of the same shape, recursively;
* then each writer up to the version, on its intersection with the span: a
  random op whose elements take their own words (``rng._ranges``: ``uniform_``,
  ``normal_``'s Box-Muller blocks ...) drawn from the state jumped to their
  first word; ``fill_``/``zero_``/``copy_`` and pointwise in-place ops whose
  other arguments are scalars, one-element tensors or spans of the same shape.

Writers whose elements in the span later writes set again without reading
them (``normal_`` after ``kaiming_uniform_``, as Hugging Face models do; the
copies ``dcp.load`` makes, one per saved chunk) are skipped: with jump-ahead
their draws cost nothing. Anything else (an op that mixes elements, a
non-contiguous slice, a CUDA generator, an unmodeled or data-dependent random
call) makes the hook answer None, and the plan replays the value as recorded.

The hook computes a value only if no later write to its storage was recorded
(its version is the storage's last), so nothing replayed afterwards can write
through the substitute. The targets of a run that share a storage are
computed as one range and share it (FSDP2's padded flat shard and its
unpadded view); a whole storage is left in the replay cache, as replayed ones
are.

Elements drawn are counted in ``drawn``, so tests can see that a rank drew its
rows and not the parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from torchdefer.distributed._row_calls import (
    NotSliceable,
    composite_step,
    contiguous_range,
    creator_step,
    random_step,
)
from torchdefer.fake import _pinned
from torchdefer.fake._layout import non_overlapping_and_dense
from torchdefer.materialize._plan import (
    COPY,
    FILLS,
    Ranges,
    sets_regardless,
    writes_first_argument,
)
from torchdefer.recorder._ambient import AmbientSwitch
from torchdefer.recorder._args import unflatten_call
from torchdefer.recorder._graph import Node, NodeKind, Storage, TensorMeta, Value
from torchdefer.recorder._mode import suspended

if TYPE_CHECKING:
    from torchdefer.materialize._replay import Replay

__all__ = ["NotSliceable", "RowReplay", "Span", "contiguous_range"]


Step = Callable[[torch.Tensor], None]


@dataclass(slots=True, eq=False)
class Span:
    """Elements ``[lo, hi)`` of ``storage`` at ``version``, and how to compute them."""

    storage: Storage
    version: int
    lo: int
    hi: int
    dtype: torch.dtype
    device: torch.device
    # Each step updates the span's buffer (hi - lo elements) in order.
    steps: list[Step] = field(default_factory=list)

    def compute(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The span's elements, into ``out`` (contiguous, of the span's dtype) if given."""
        if out is None:
            out = torch.empty(self.hi - self.lo, dtype=self.dtype, device=self.device)
        for step in self.steps:
            step(out)
        return out


class RowReplay:
    """The ``substitute`` hook of one replay: values from their own elements, or None.

    ``targets`` are the values the replay is run for: the elements of a storage
    that they cover together are computed once, so targets that shared their
    storage in eager code share it here (FSDP2's padded flat shard and its
    unpadded view). Other values get their own elements.
    """

    def __init__(self, replay: Replay, targets: Sequence[tuple[Value, int]] = ()) -> None:
        self.replay = replay
        self.drawn = 0  # elements random ops drew (the span's and partial blocks')
        self._why: dict[int, str] = {}  # id(value) -> why it was not computed here
        self._ambient: AmbientSwitch | None = None  # while computing
        # (id(storage), version) -> (lo, hi): the elements the targets cover
        self._cover: dict[tuple[int, int], tuple[int, int]] = {}
        # (id(storage), version) -> (lo, hi, their elements), computed in this run
        self._computed: dict[tuple[int, int], list[tuple[int, int, torch.Tensor]]] = {}
        for value, version in targets:
            found = _range_of(value, version)
            if found is not None:
                storage, version, (lo, hi) = found[0], found[1], found[3]
                old = self._cover.get((id(storage), version), (lo, hi))
                self._cover[(id(storage), version)] = (min(lo, old[0]), max(hi, old[1]))

    def __call__(self, value: Value, version: int) -> torch.Tensor | None:
        if version != value.storage.version:
            return None  # a later write could go through the substitute
        try:
            with suspended(), torch.no_grad(), AmbientSwitch() as self._ambient:
                return self._substitute(value, version)
        except NotSliceable as e:
            self._why[id(value)] = str(e)
            return None
        finally:
            self._ambient = None

    def use(self, node: Any) -> None:
        """Run what follows under the settings ``node`` was recorded with (default dtype,
        deterministic mode), as replay does."""
        if self._ambient is not None:
            self._ambient.use(node.ambient)

    def answered(self, value: Value) -> bool:
        """Whether this run computed ``value``'s elements here rather than by replay."""
        return self._found(value, value.storage.version) is not None

    def why_not(self, value: Value) -> str | None:
        """Why ``value`` was not computed here (the op that stopped it), if it was asked."""
        return self._why.get(id(value))

    def _found(self, value: Value, version: int) -> tuple[Any, int, int, torch.Tensor] | None:
        found = _range_of(value, version)
        if found is None:
            return None
        storage, version, meta, (lo, hi) = found
        for a, b, real in self._computed.get((id(storage), version), ()):
            if a <= lo and hi <= b:
                return meta, a, b, real
        return None

    def _substitute(self, value: Value, version: int) -> torch.Tensor | None:
        found = _range_of(value, version)
        if found is None:
            return None
        storage, version, meta, (lo, hi) = found
        known = self._found(value, value.storage.version)
        stored = False
        if known is None:
            cover = self._cover.get((id(storage), version), (lo, hi))
            if not (cover[0] <= lo and hi <= cover[1]):
                cover = (lo, hi)
            real = self.span(storage, version, *cover).compute()
            if storage.pinned:  # eager's storage is page-locked (t.pin_memory())
                real = _pinned.pin(real)
            self._computed.setdefault((id(storage), version), []).append((*cover, real))
            stored = cover == (0, _elements(storage)) and version == storage.version
            known = (meta, *cover, real)
        meta, a, _, real = known
        out = torch.empty(0, dtype=meta.dtype, device=real.device)
        out.set_(real.untyped_storage(), meta.offset - a, meta.size, meta.stride)
        if stored:  # the whole storage: later replays find it, as they find replayed ones
            self.replay.cache.store(value, version, self.replay.device_key, out)
        return out

    # ------------------------------------------------------------ analysis

    def span(self, storage: Storage, version: int, lo: int, hi: int) -> Span:
        """How to compute elements ``[lo, hi)`` of ``storage`` at ``version``; raises
        :class:`NotSliceable` if some op in its history cannot be computed in part."""
        created = _created_value(storage)
        device = self.replay.map_device(created.meta.device)
        if device.type != "cpu":
            raise NotSliceable(storage.creator, f"replays on {device}, not the CPU")
        if not 0 <= lo <= hi <= _elements(storage, version):
            raise NotSliceable(storage.creator, f"elements [{lo}, {hi}) are not in its storage")
        span = Span(storage, version, lo, hi, created.meta.dtype, device)
        live, from_creator = self._live_writers(storage.writers[:version], span)
        if from_creator:
            span.steps.append(creator_step(self, storage.creator, created, span))
        span.steps.extend(self._writer_step(writer, span) for writer in live)
        return span

    def _live_writers(self, writers: list[Node], span: Span) -> tuple[list[Node], bool]:
        """The writers ``span``'s elements depend on (oldest first), and whether its
        creator's elements show through. A writer whose elements in the span are all set
        again by later writes that do not read them (``normal_`` after
        ``kaiming_uniform_``, ``dcp.load``'s copies) is dead: with exact generator
        positions even its draws are skipped. An elementwise writer reads only its own
        elements (other spans it reads are computed on their own)."""
        covered = Ranges()  # elements set regardless by the live writes after
        live: list[Node] = []
        for writer in reversed(writers):
            if covered.covers(span.lo, span.hi):
                return live[::-1], False
            # A write through a view rows cannot follow: not sliceable, before any
            # step is built (an older writer's would draw its input's rows first).
            _, o, end, _ = self._target(writer, span)
            a, b = max(span.lo, o), min(span.hi, end)
            if a >= b or covered.covers(a, b):
                continue  # writes none of the span's elements, or only dead ones
            live.append(writer)
            if sets_regardless(writer):
                covered.add(a, b)
            else:
                covered.remove(a, b)
        return live[::-1], not covered.covers(span.lo, span.hi)

    def _target(self, writer: Any, span: Span) -> tuple[Value, int, int, bool]:
        """The value ``writer`` writes ``span``'s storage through, its element range, and
        whether that range is in element order (else a dense view covering it all)."""
        written = [s for s, _ in writer.writes]
        target = writer.leaves[0] if writer.leaves else None
        if (
            written != [span.storage]
            or not isinstance(target, Value)
            or target.storage is not span.storage
            or target.meta.dtype != span.dtype
        ):
            raise NotSliceable(writer, "writes its storage through another argument or dtype")
        rng = contiguous_range(target.meta)
        if rng is not None:
            return target, rng[0], rng[1], True
        meta = target.meta
        # Dense from offset 0 and as many elements as the storage had then: all
        # of it (a transposed view of a bigger or since grown storage is not).
        whole = _elements(span.storage, writer.writes[0][1])
        if (non_overlapping_and_dense(meta.size, meta.stride) and meta.offset == 0
                and math.prod(meta.size) == whole):
            return target, 0, whole, False
        raise NotSliceable(writer, "writes a strided part of its storage")

    def _writer_step(self, writer: Any, span: Span) -> Step:
        target, o, end, ordered = self._target(writer, span)
        a, b = max(span.lo, o), min(span.hi, end)
        if writer.kind == NodeKind.RANDOM:
            if ordered and not hasattr(writer.op, "_schema"):  # a composite
                return composite_step(self, writer, end - o, a - o, b - o, a - span.lo)
            if not ordered or not writes_first_argument(writer.op):
                raise NotSliceable(writer, "draws into a strided view")
            return random_step(self, writer, o, end - o, a - o, b - o, a - span.lo)
        if writer.op in FILLS or writer.op is COPY or _pointwise_in_place(writer):
            return self._elementwise_step(writer, target, ordered, o, a, b, span.lo)
        raise NotSliceable(writer, "is not elementwise")

    def _elementwise_step(
        self, node: Node, target: Value, ordered: bool, o: int, a: int, b: int, lo: int
    ) -> Step:
        """An in-place elementwise op on ``[a, b)``: its other tensors as 0-dim values
        or as spans of the same shape (only where the written range is in order)."""
        inputs = self.elementwise_inputs(node, skip=target, shape=target.meta.size,
                                         ordered=ordered, shift=(a - o, b - o))
        copy_from = inputs.get(1) if node.op is COPY else None

        def step(buf: torch.Tensor) -> None:
            part = buf[a - lo : b - lo]
            if isinstance(copy_from, Span) and copy_from.dtype == part.dtype:
                copy_from.compute(out=part)  # straight into place
                return
            leaves = self.real_leaves(node, inputs, part)
            args, kwargs = unflatten_call(leaves, node.spec)
            self.use(node)
            node.op(*args, **kwargs)

        return step

    def elementwise_inputs(
        self,
        node: Node,
        skip: Value | None,
        shape: tuple[int, ...],
        ordered: bool,
        shift: tuple[int, int],
    ) -> dict[int, Any]:
        """For each tensor leaf of ``node`` but ``skip``: a 0-dim value (read whole at
        run time) or a :class:`Span` of the elements ``shift`` of a same-shape input."""
        inputs: dict[int, Any] = {}
        reads = iter(node.reads)
        for i, leaf in enumerate(node.leaves):
            if not isinstance(leaf, Value):
                continue
            version = next(reads)
            if leaf is skip:
                continue
            storage, read, meta = leaf.storage, version, leaf.meta
            rng = contiguous_range(meta)
            if meta.size == shape and ordered and rng and meta.dtype == _storage_dtype(storage):
                inputs[i] = self.span(storage, read, rng[0] + shift[0], rng[0] + shift[1])
            elif math.prod(meta.size) == 1 and len(meta.size) <= len(shape):
                inputs[i] = (leaf, version)  # broadcast: its one value, read at run time
            else:
                raise NotSliceable(node, "reads a tensor that is not its own shape, in order")
        return inputs

    def real_leaves(
        self, node: Node, inputs: dict[int, Any], self_part: torch.Tensor | None
    ) -> list[Any]:
        """``node``'s leaves with real tensors: its own part, spans computed, 0-dim read."""
        leaves: list[Any] = []
        for i, leaf in enumerate(node.leaves):
            if isinstance(leaf, Value):
                found = inputs.get(i)
                if found is None:
                    leaf = self_part
                elif isinstance(found, Span):
                    leaf = found.compute()
                else:  # one value, broadcast; kept dimensioned if it was (type promotion)
                    real = self.replay.nested([found])[0]
                    leaf = real if real.dim() == 0 else real.reshape(1)
            else:
                leaf = self.replay.map_leaf(leaf)
            leaves.append(leaf)
        return leaves


def _range_of(
    value: Value, version: int
) -> tuple[Storage, int, TensorMeta, tuple[int, int]] | None:
    """(storage, version, metadata, element range) that ``value`` reads, if in order."""
    storage, meta = value.storage, value.meta
    try:
        if meta.dtype != _storage_dtype(storage):
            return None
    except NotSliceable:
        return None
    rng = contiguous_range(meta)
    return None if rng is None else (storage, version, meta, rng)


def _created_value(storage: Storage) -> Value:
    for value in storage.creator.outputs:
        if value.storage is storage:
            return value
    raise NotSliceable(storage.creator, "does not create the storage it is recorded for")


def _storage_dtype(storage: Storage) -> torch.dtype:
    return _created_value(storage).meta.dtype


def _elements(storage: Storage, version: int | None = None) -> int:
    """Its elements at ``version`` (now by default): resize_ and set_ grow storages."""
    nbytes = storage.nbytes if version is None else storage.nbytes_at(version)
    return nbytes // _storage_dtype(storage).itemsize


def _pointwise_in_place(node: Any) -> bool:
    tags = getattr(node.op, "tags", ())
    return torch.Tag.pointwise in tags and writes_first_argument(node.op)
