"""Which recorded nodes must run to produce some values: the slice of the graph.

Walk from the wanted values back in time, keeping the ``(value, version)``
pairs still needed. A value needs the node that produced it and every node
that wrote its storage up to the version it is read at; each of those nodes
needs its own inputs at the versions it read them. Values whose storage is
already real at the version needed come from the cache and stop the walk.
Replaying the needed nodes in recording order reproduces each value exactly,
including in-place writes done through views after the value was taken.

A ``substitute`` hook may answer a value itself (a real tensor, or None to
expand it as usual): the sharded path computes a slice of a parameter from its
own elements that way (``distributed._rows``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from torchdefer.materialize._cache import ReplayCache
from torchdefer.materialize._overwrites import (
    COPY,
    FILLS,
    Ranges,
    live_writers,
    sets_regardless,
    writes_first_argument,
    writes_in_place,
)
from torchdefer.recorder._graph import Node, NodeKind, Storage, Value

# COPY, FILLS, Ranges, sets_regardless, writes_first_argument: what a substitute
# (distributed.rows) needs to judge writes as the slice does.
__all__ = ["COPY", "FILLS", "Plan", "Ranges", "Substitute", "make_plan", "recorded_slice",
           "sets_regardless", "writes_first_argument"]

# (value, version) -> its real tensor, or None to replay it as recorded
Substitute = Callable[[Value, int], torch.Tensor | None]


@dataclass(slots=True)
class Plan:
    nodes: list[Node]  # in recording order
    # (id(value), version) -> real tensor rebuilt from the cache
    cached: dict[tuple[int, int], torch.Tensor]
    # ids of in-place nodes whose write a later write hides: replay passes
    # their first argument through (the tensor object) without running them.
    passthrough: set[int] = field(default_factory=set)
    # (id(node), input index) whose tensor only lends its dtype and device
    # (new_zeros' template): replay passes an empty stand-in.
    standins: set[tuple[int, int]] = field(default_factory=set)
    # ids of factory nodes whose every element later writes set again
    # (nn.Parameter(torch.randn(...)), then dcp.load): replay only allocates.
    allocate: set[int] = field(default_factory=set)


def make_plan(
    targets: list[tuple[Value, int]],
    cache: ReplayCache | None,
    device_key: str,
    device: torch.device | None,
    substitute: Substitute | None = None,
    aliases: bool = True,
) -> Plan:
    """The nodes to replay for ``targets``, and the values the cache answers
    (``cache`` None: none, every node needed is listed).

    ``aliases``: the targets are tensors for the user, each the user's tensor
    (or a view of it) as it is now where it was materialized before; else
    they are inputs, wanted with what construction gave them.
    """
    walk = _Walk(cache, device_key, device, substitute)
    # A target is the user's tensor (or a view of it) as it is now, and so is
    # any value of its storage the walk meets (the base a view of it is rebuilt
    # from, the tensor set_ made it share); any other input is what
    # construction gave it (ReplayCache.lookup).
    walk.as_is = {id(v.storage) for v, _ in targets} if aliases else set()
    walk.work = [(v, version, True) for v, version in targets]
    return walk.run()


def recorded_slice(targets: list[tuple[Value, int]]) -> list[Node]:
    """The recorded nodes replaying ``targets`` runs, in recording order, as if
    nothing were real yet: what a picture or an explanation of them shows.

    No cache is read (none is made either): every node needed is listed.
    """
    return make_plan(targets, None, "recorded", None).nodes


class _Walk:
    """One walk back from the targets (see the module docstring)."""

    def __init__(self, cache: ReplayCache | None, device_key: str, device: torch.device | None,
                 substitute: Substitute | None) -> None:
        self.cache, self.device_key, self.device = cache, device_key, device
        self.substitute = substitute
        self.as_is: set[int] = set()
        # (value, version, whether its contents are needed or only the tensor object)
        self.work: list[tuple[Value, int, bool]] = []
        self.needed: dict[int, Node] = {}
        self.must_run: set[int] = set()  # nodes whose effect is needed, not only their output
        self.cached: dict[tuple[int, int], torch.Tensor] = {}
        self.expanded: dict[int, set[int]] = {}  # id(storage) -> indices of the writers added
        self.standins: set[tuple[int, int]] = set()
        # Factories whose storage's elements may all be overwritten: decided at the end.
        self.pending: dict[int, Storage] = {}
        self.creator_read: set[int] = set()  # ids of storages whose creator's elements show

    def run(self) -> Plan:
        while True:
            while self.work:
                self._visit(*self.work.pop())
            # A factory whose elements no needed version shows only allocates;
            # the others run, and what they read (a pinned copy's input) is walked.
            shown = [s for s in self.pending.values() if id(s) in self.creator_read]
            if not shown:
                break
            for storage in shown:
                del self.pending[id(storage)]
                self._need(storage.creator, effect=True)
        allocate = {id(s.creator) for s in self.pending.values()}
        self.must_run |= allocate
        nodes = sorted(self.needed.values(), key=lambda n: n.seq)
        return Plan(nodes, self.cached, set(self.needed) - self.must_run, self.standins, allocate)

    def _visit(self, value: Value, version: int, contents: bool) -> None:
        key = (id(value), version)
        if key in self.cached:
            return
        real = None if self.cache is None else self.cache.lookup(
            value, version, self.device_key, alias=id(value.storage) in self.as_is)
        if real is None and self.substitute is not None and contents:
            real = self.substitute(value, version)
        if real is not None:
            self.cached[key] = real
            return
        storage = value.storage
        creator = storage.creator
        deferred = _factory(creator)
        if value.node is not creator or not deferred:
            # The node that made this value: only its output object is needed if
            # it is an in-place write (of contents no one reads, or hidden later).
            self._need(value.node, effect=not writes_in_place(value.node))
        done = self.expanded.get(id(storage))
        if done is None:
            done = self.expanded[id(storage)] = set()
            if deferred:
                self.needed.setdefault(id(creator), creator)
                self.pending[id(storage)] = storage
            else:
                self._need(creator, effect=True)
        if not contents:
            return
        live, shows_creator = live_writers(storage, version)
        if shows_creator:
            self.creator_read.add(id(storage))
        for i in live:
            if i not in done:
                done.add(i)
                self._need(storage.writers[i], effect=True)

    def _need(self, node: Node, effect: bool) -> None:
        """Add ``node`` and queue what it reads.

        Without ``effect`` only its output object is wanted (an in-place write
        whose contents no one reads): replay passes its first argument through.
        A node that sets the elements of its first argument without reading
        them (``copy_``, ``fill_``, ``normal_``) needs that argument's object,
        not its contents; so does a view of the storage it aliases, whose
        contents are the storage's at the version the view is read at. The
        template of ``new_zeros`` and the like is not needed at all: replay
        gives it a stand-in of its dtype and device (``standins``).
        """
        first = id(node) not in self.needed
        if first:
            self.needed[id(node)] = node
        if effect and id(node) not in self.must_run:
            self.must_run.add(id(node))
            hides = writes_in_place(node) and sets_regardless(node)
            aliased = _aliased_inputs(node)
            template = (getattr(node.op, "overloadpacket", None) in _TEMPLATES
                        and bool(node.inputs) and node.leaves[0] is node.inputs[0])
            for i, (value, version) in enumerate(zip(node.inputs, node.reads)):
                if template and i == 0:
                    self.standins.add((id(node), 0))
                    continue
                object_only = (hides and i == 0) or id(value.storage) in aliased
                self.work.append((value, version, not object_only))
        elif first and not effect:
            self.work.append((node.inputs[0], node.reads[0], False))


def _factory(node: Node) -> bool:
    """A node that makes one tensor from no tensor, writing nothing else (``empty``,
    ``randn``), or a pinned copy (FSDP2's CPU offload): its layout is the recorded
    one, so replay can allocate it instead when its elements do not show."""
    if len(node.outputs) != 1 or node.writes:
        return False
    if node.op is _PIN_MEMORY:  # the input's sizes and strides, at offset 0 (fake._pinned)
        return True
    return node.kind in (NodeKind.FACTORY, NodeKind.RANDOM) and not node.inputs


_PIN_MEMORY = torch.ops.aten._pin_memory.default

# Ops that read only the dtype and device of their first argument (FSDP2's
# padded shard is `param.new_zeros(...)`). Not the *_like ops: they keep the
# template's strides, which only replay knows where meta kernels differ.
_aten = torch.ops.aten
_TEMPLATES = frozenset(
    {_aten.new_empty, _aten.new_empty_strided, _aten.new_zeros, _aten.new_ones, _aten.new_full}
)


def _aliased_inputs(node: Node) -> set[int]:
    """ids of the input storages a view node's outputs all alias (none if it computes
    any output of its own)."""
    if node.kind not in (NodeKind.VIEW, NodeKind.DATA_GET) or not node.outputs:
        return set()
    inputs = {id(v.storage) for v in node.inputs}
    outputs = {id(v.storage) for v in node.outputs}
    return outputs if outputs <= inputs else set()
