"""The recorded graph: nodes (one per op call), values, and storage versions.

A :class:`Node` knows its inputs (values, with the storage version each was
read at) and its outputs; a :class:`Storage` knows every node that wrote it, in
order, so the graph can be walked both ways (mutations included). The
graph holds no list of all nodes: nodes live as long as a tensor, a storage or
an RNG stream can reach them, so materialized parts are freed by the GC.

Every node enters through one door, :meth:`Graph.add_node` (as in torch.fx's
``Graph.create_node``), which numbers it and gives it its source line and the
settings it ran under. This module knows how a graph looks, not how it is
recorded (``recorder._record``) nor replayed (``torchdefer.materialize``, which
keeps its caches itself).
"""

from __future__ import annotations

import enum
import itertools
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from torchdefer import _compat
from torchdefer.errors import InternalError
from torchdefer.fake._source import SourceLocation, user_frame
from torchdefer.recorder._ambient import Ambient, current_ambient
from torchdefer.recorder._args import unflatten_call
from torchdefer.rng._stream import Placement

if TYPE_CHECKING:  # made by the recorder, which builds on this module (recorder.context)
    from torchdefer.recorder._rng_placement import RngRecorder

__all__ = [
    "Graph",
    "Holders",
    "Node",
    "NodeKind",
    "Placement",
    "SourceLocation",
    "Storage",
    "TensorMeta",
    "Value",
]


class NodeKind(str, enum.Enum):
    """The kinds of recorded node.

    A ``str`` enum: members compare equal to, print and serialize as their
    plain strings (``"random"``), as graph views and exports show them.
    """

    FACTORY = "factory"  # creates a tensor from nothing (empty, zeros, arange)
    RANDOM = "random"  # draws from a generator (randn, normal_, randperm)
    VIEW = "view"  # aliases an input's storage (view, t, slicing, detach)
    INPLACE = "inplace"  # writes an input's storage (add_, copy_, fill_)
    CALL = "call"  # any other op: new storage computed from inputs
    CONSTANT = "constant"  # value captured from Python data (torch.tensor)
    EXTERNAL = "external"  # a real tensor from outside, referenced and version-checked
    DATA_GET = "data_get"  # `t.data`
    DATA_SET = "data_set"  # `t.data = other`
    OBSERVE = "observe"  # a data-dependent read during recording (.item(), .tolist())

    # The plain string, also in f-strings (Python 3.12 formats a mixed-in enum
    # as "NodeKind.RANDOM" otherwise).
    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


# Read once: on Python 3.11 an Enum member lookup costs ~0.1 µs (EnumType.__getattr__).
_OBSERVE = NodeKind.OBSERVE


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """What a tensor looks like, without its data."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    device: torch.device
    # The lazy conjugate / negative bits of views (`z.conj()`, `z.conj().imag`):
    # a view rebuilt from its storage alone would lose them, and its values.
    conj: bool = False
    neg: bool = False

    @staticmethod
    def of(t: torch.Tensor, device: torch.device) -> TensorMeta:
        """``t``'s metadata as seen on ``device``; one shared object per distinct value.

        Shared because a model records the same few layouts over and over (80
        identical layers in a 70B Llama): each object a recording keeps is
        scanned by the cyclic GC, and a new one per output (with its size and
        stride tuples) was three of them. Sharing is safe: it is frozen and
        compares by value, and nothing asks whether two are the same object.
        """
        key = (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, device, t.is_conj(),
               t.is_neg())
        try:
            meta = _metas.get(key)
        except TypeError:  # an unhashable size (a symbolic one): not shared
            return _filled(key)
        if meta is None:
            if len(_metas) >= _METAS_KEPT:  # bounded: a long process sees many shapes
                _metas.clear()
            meta = _metas[key] = _filled(key)
        return meta


@dataclass(slots=True, eq=False)
class Storage:
    """One recorded storage; ``version`` counts the writes recorded so far."""

    id: int
    creator: Node
    nbytes: int  # its size now: resize_ and set_ grow a storage under every view of it
    version: int = 0
    # writers[v - 1] produced version v. A list (not a dict) because versions
    # are dense and the slice walks them in order.
    writers: list[Node] = field(default_factory=list)
    # (version, size before it) for each write that grew the storage, oldest
    # first: whether a write covers the whole storage depends on its size then.
    # A tuple, replaced on the rare growth: a list per storage would be one more
    # object the cyclic GC scans, for every factory of a model.
    grown: tuple[tuple[int, int], ...] = ()
    # Set by materialization once the storage is real; later writes are refused.
    materialized: bool = False
    # Made by a pinning call (t.pin_memory(), pin_memory=True): eager's storage
    # is page-locked, so is_pinned() says so and replay pins (fake._pinned).
    pinned: bool = False

    def nbytes_at(self, version: int) -> int:
        """Its size in bytes at ``version``."""
        size = self.nbytes
        for grew_at, before in reversed(self.grown):
            if grew_at <= version:
                break
            size = before
        return size

    def __repr__(self) -> str:
        return f"Storage(#{self.id}, v{self.version})"


@dataclass(slots=True, eq=False)
class Value:
    """One tensor produced by a node: output ``index`` of ``node``."""

    node: Node
    index: int
    storage: Storage
    meta: TensorMeta

    def __repr__(self) -> str:
        return f"%{self.node.seq}.{self.index}"


@dataclass(slots=True, eq=False)
class Node:
    """One recorded op call.

    ``leaves``/``spec`` are the flattened ``(args, kwargs)`` with every tensor
    replaced by its :class:`Value`; ``reads[i]`` is the version of
    ``inputs[i].storage`` when the op read it; ``writes`` lists the
    ``(storage, new_version)`` pairs the op produced.
    """

    seq: int
    kind: NodeKind  # known when the node is made, never changed
    op: Any
    leaves: list[Any]
    spec: Any
    inputs: tuple[Value, ...]
    reads: tuple[int, ...]
    outputs: list[Value] = field(default_factory=list)
    writes: tuple[tuple[Storage, int], ...] = ()
    rng: Placement | None = None  # where a random node draws (rng.ledger places it)
    source: SourceLocation | None = None  # the user's line that called the op
    payload: Any = None  # constant / external tensor, or the observed value
    graph: Graph | None = None
    # Settings the op read when recorded (default dtype, deterministic mode);
    # replay re-applies them (recorder/_ambient.py). None: the op runs no kernel.
    ambient: Ambient | None = None

    def arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's ``(args, kwargs)``, each input tensor shown as its :class:`Value`."""
        if self.spec is None:
            return (), {}
        return unflatten_call(self.leaves, self.spec)

    @property
    def name(self) -> str:
        return str(self.op) if self.op is not None else self.kind.value

    def where(self) -> str:
        return "<unknown location>" if self.source is None else str(self.source)

    def __repr__(self) -> str:
        return f"Node(%{self.seq} {self.kind} {self.name} at {self.where()})"


class Holders:
    """Storage address -> a live deferred tensor over that storage (the latest given).

    A dict of plain weak references rather than a ``WeakValueDictionary``:
    every op that makes a storage registers one, and the latter's
    ``__setitem__`` (a ``KeyedRef`` with a removal callback) costs ~1.6 µs
    there, a weak reference ~0.3. Entries of dead tensors answer None and are
    swept whenever the map has doubled since the last sweep.
    """

    __slots__ = ("_refs", "_sweep_at")

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._sweep_at = 1024

    def __setitem__(self, key: int, tensor: Any) -> None:
        refs = self._refs
        refs[key] = weakref.ref(tensor)
        if len(refs) >= self._sweep_at:
            self._refs = {k: r for k, r in refs.items() if r() is not None}
            self._sweep_at = max(1024, 2 * len(self._refs))

    def get(self, key: int) -> Any:
        ref = self._refs.get(key)
        return None if ref is None else ref()

    def over(self, storage: Any) -> Any:
        """The live deferred tensor over ``storage`` (an untyped or typed storage
        object, one made in C++ too), or None."""
        untyped = storage._untyped_storage if isinstance(storage, torch.TypedStorage) else storage
        held = self.get(untyped._cdata)
        return held if held is not None and _compat.storage_id(held) == untyped._cdata else None

    def __len__(self) -> int:
        return sum(r() is not None for r in self._refs.values())


class Graph:
    """The state of one ``deferred_init`` recording.

    Holds the sequence counter, the RNG ledger whose streams place the random
    nodes, the external tensors and the data-dependent reads. Every deferred
    tensor points to its graph; nodes are made by :meth:`add_node` alone.
    """

    def __init__(self, rng: RngRecorder) -> None:
        self.op_count = 0  # nodes recorded so far; also the next node's seq
        self._storage_ids = itertools.count()
        self.rng = rng
        # id(real tensor) -> (tensor, its deferred stand-in); keeps the real
        # tensor alive so ids are not reused while recorded.
        self.externals: dict[int, tuple[torch.Tensor, Any]] = {}
        # Data-dependent reads seen while recording (.item(), .tolist()): no
        # tensor depends on them, so only this list reaches them (for viz).
        self.observations: list[Node] = []
        # meta storage address -> a deferred tensor over it, for each storage
        # made: `x.set_(y, offset, size)` reaches the dispatcher with a storage
        # object C++ made, which names no tensor (recorder/_storage_versions.py).
        self.holders = Holders()

    def add_node(
        self,
        kind: NodeKind,
        op: Any,
        leaves: list[Any],
        spec: Any,
        inputs: tuple[Value, ...],
        reads: tuple[int, ...],
        *,
        skip: int = 2,
        runs_kernel: bool = True,
        ambient: Ambient | None = None,
    ) -> Node:
        """A new node of this graph: numbered, with the user's line and its settings.

        Args:
            kind: what the node does (fixed for its life).
            op: the op overload (or function) called; None for a node that calls none.
            leaves, spec: the flattened call (``recorder._args``), tensors as values.
            inputs, reads: the values read and their storages' versions then.
            skip: frames between the caller of ``add_node`` and the user's code, at
                least (``fake._source.user_frame``'s argument, seen from the caller):
                jumped over unwalked.
            runs_kernel: replay runs a kernel for it, under the settings in force
                now (``recorder._ambient``); False: it has none.
            ambient: the settings to replay it under, where not those in force now.

        >>> from torchdefer.recorder._rng_placement import RngRecorder
        >>> g = Graph(RngRecorder())
        >>> n = g.add_node(NodeKind.FACTORY, torch.ops.aten.zeros.default, [[2]], None, (), ())
        >>> n.seq, n.kind, n.graph is g, g.op_count
        (0, <NodeKind.FACTORY: 'factory'>, True, 1)
        """
        seq = self.op_count
        self.op_count = seq + 1
        if runs_kernel and ambient is None:
            ambient = current_ambient()
        node = Node(seq, kind, op, leaves, spec, inputs, reads, [], (), None,
                    user_frame(skip + 1), None, self, ambient)
        if kind is _OBSERVE:
            self.observations.append(node)
        return node

    def new_storage(self, creator: Node, nbytes: int) -> Storage:
        return Storage(next(self._storage_ids), creator, nbytes)


# TensorMeta.of's direct slot setters, in the order of its key.
_META_FIELDS = ("size", "stride", "offset", "dtype", "device", "conj", "neg")
if tuple(TensorMeta.__dataclass_fields__) != _META_FIELDS:  # TensorMeta.of fills these
    raise InternalError("TensorMeta.of does not fill every field of TensorMeta; this is a bug "
                        "in torchdefer, please report it")
_new_meta = object.__new__
_META_SETTERS = tuple(getattr(TensorMeta, name).__set__ for name in _META_FIELDS)


def _filled(values: tuple[Any, ...]) -> TensorMeta:
    """A new TensorMeta of ``values`` (in ``_META_FIELDS``' order), filled through the
    slots: the frozen ``__init__``'s seven ``object.__setattr__`` calls cost as much again."""
    meta = _new_meta(TensorMeta)
    for setter, value in zip(_META_SETTERS, values):
        setter(meta, value)
    return meta


# The field values (in _META_FIELDS' order) -> the TensorMeta holding them.
_metas: dict[tuple[Any, ...], TensorMeta] = {}
_METAS_KEPT = 4096
