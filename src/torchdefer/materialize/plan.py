"""Which recorded nodes must run to produce some values: the slice of seed 001.

Walk from the wanted values back in time, keeping the ``(value, version)``
pairs still needed. A value needs the node that produced it and every node
that wrote its storage up to the version it is read at; each of those nodes
needs its own inputs at the versions it read them. Values whose storage is
already real at the version needed come from the cache and stop the walk.
Replaying the needed nodes in recording order reproduces each value exactly,
including in-place writes done through views after the value was taken.

A ``substitute`` hook may answer a value itself (a real tensor, or None to
expand it as usual): the sharded path computes a slice of a parameter from its
own elements that way (``materialize.rows``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from torchdefer.fake.layout import non_overlapping_and_dense
from torchdefer.materialize.cache import ReplayCache
from torchdefer.recorder.graph import Node, NodeKind, Storage, Value

__all__ = ["Plan", "Substitute", "make_plan"]

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


def make_plan(
    targets: list[tuple[Value, int]],
    cache: ReplayCache,
    device_key: str,
    device: torch.device,
    substitute: Substitute | None = None,
    aliases: bool = True,
) -> Plan:
    """The nodes to replay for ``targets``, and the values the cache answers.

    ``aliases``: the targets are tensors for the user, each the user's tensor
    (or a view of it) as it is now where it was materialized before; else
    they are inputs, wanted with what construction gave them.
    """
    needed: dict[int, Node] = {}
    must_run: set[int] = set()  # nodes whose effect is needed, not only their output object
    cached: dict[tuple[int, int], torch.Tensor] = {}
    expanded: dict[int, set[int]] = {}  # id(storage) -> indices of the writers added
    # (value, version, whether its contents are needed or only the tensor object)
    work: list[tuple[Value, int, bool]] = [(v, version, True) for v, version in targets]
    # A target is the user's tensor (or a view of it) as it is now, and so is
    # any value of its storage the walk meets (the base a view of it is rebuilt
    # from, the tensor set_ made it share); any other input is what
    # construction gave it (ReplayCache.lookup).
    as_is = {id(v.storage) for v, _ in targets} if aliases else set()
    while work:
        value, version, contents = work.pop()
        key = (id(value), version)
        if key in cached:
            continue
        real = cache.lookup(value, version, device_key, device or value.meta.device,
                            alias=id(value.storage) in as_is)
        if real is None and substitute is not None and contents:
            real = substitute(value, version)
        if real is not None:
            cached[key] = real
            continue
        storage = value.storage
        # The node that made this value: only its output object is needed if
        # it is an in-place write (of contents no one reads, or hidden later).
        in_place = _writes_in_place(value.node)
        _need(value.node, needed, must_run, work, effect=not in_place)
        done = expanded.get(id(storage))
        if done is None:
            _need(storage.creator, needed, must_run, work, effect=True)
            done = expanded[id(storage)] = set()
        if not contents:
            continue
        for i in range(_last_overwrite(storage, version), version):
            if i not in done:
                done.add(i)
                _need(storage.writers[i], needed, must_run, work, effect=True)
    passthrough = set(needed) - must_run
    return Plan(sorted(needed.values(), key=lambda n: n.seq), cached, passthrough)


def _need(node: Node, needed: dict[int, Node], must_run: set[int], work: list, effect: bool):
    """Add ``node`` and queue what it reads.

    Without ``effect`` only its output object is wanted (an in-place write
    whose contents no one reads): replay passes its first argument through.
    A node that overwrites all of its first argument needs that argument's
    object, not its contents.
    """
    first = id(node) not in needed
    if first:
        needed[id(node)] = node
    if effect and id(node) not in must_run:
        must_run.add(id(node))
        hides = _writes_in_place(node) and _overwrites(node, node.writes[0][0])
        for i, (value, version) in enumerate(zip(node.inputs, node.reads)):
            work.append((value, version, not (hides and i == 0)))
    elif first and not effect:
        work.append((node.inputs[0], node.reads[0], False))


def _writes_in_place(node: Node) -> bool:
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


# In-place ops that set every element they write whatever its value was.
FILLS = frozenset(
    {torch.ops.aten.fill_.Scalar, torch.ops.aten.fill_.Tensor, torch.ops.aten.zero_.default}
)
COPY = torch.ops.aten.copy_.default


def writes_first_argument(op: Any) -> bool:
    """Whether ``op``'s schema says it writes its first argument (``Tensor(a!) self``)."""
    schema = getattr(op, "_schema", None)
    first = schema.arguments[0].alias_info if schema is not None and schema.arguments else None
    return first is not None and first.is_write


def _last_overwrite(storage: Storage, version: int) -> int:
    """The index of the last writer before ``version`` that sets the whole storage
    regardless of its contents (0 if none): the writers before it need not run.

    Hugging Face models initialise every weight twice (the layer's own
    ``kaiming_uniform_``, then ``_init_weights``' ``normal_``); with exact
    generator positions the first draw can be skipped, not only its values.
    """
    for i in range(version - 1, 0, -1):
        if _overwrites(storage.writers[i], storage):
            return i
    return 0


def _overwrites(node: Node, storage: Storage) -> bool:
    if len(node.writes) != 1 or not node.leaves or node.writes[0][0] is not storage:
        return False
    target = node.leaves[0]
    if not isinstance(target, Value) or target.storage is not storage:
        return False
    meta = target.meta
    # The storage's size when written: a view taken before it grew covers less.
    nbytes = storage.nbytes_at(node.writes[0][1])
    if meta.offset != 0 or math.prod(meta.size) * meta.dtype.itemsize != nbytes:
        return False
    if not non_overlapping_and_dense(meta.size, meta.stride):
        return False
    op = node.op
    if node.kind == NodeKind.RANDOM:
        return writes_first_argument(op)
    if op in FILLS:
        return True
    if op is COPY:
        source = node.leaves[1] if len(node.leaves) > 1 else None
        return isinstance(source, Value) and source.storage is not storage
    return False
