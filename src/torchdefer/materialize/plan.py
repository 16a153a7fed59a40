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
from dataclasses import dataclass

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


def make_plan(
    targets: list[tuple[Value, int]],
    cache: ReplayCache,
    device_key: str,
    device: torch.device,
    substitute: Substitute | None = None,
) -> Plan:
    needed: dict[int, Node] = {}
    cached: dict[tuple[int, int], torch.Tensor] = {}
    expanded: dict[int, set[int]] = {}  # id(storage) -> indices of the writers added
    work = list(targets)
    while work:
        value, version = work.pop()
        key = (id(value), version)
        if key in cached:
            continue
        real = cache.lookup(value, version, device_key, device or value.meta.device)
        if real is None and substitute is not None:
            real = substitute(value, version)
        if real is not None:
            cached[key] = real
            continue
        storage = value.storage
        nodes = [value.node]
        done = expanded.get(id(storage))
        if done is None:
            nodes.append(storage.creator)
            done = expanded[id(storage)] = set()
        for i in range(_last_overwrite(storage, version), version):
            if i not in done:
                done.add(i)
                nodes.append(storage.writers[i])
        for node in nodes:
            if id(node) not in needed:
                needed[id(node)] = node
                work.extend(zip(node.inputs, node.reads))
    return Plan(sorted(needed.values(), key=lambda n: n.seq), cached)


# In-place ops that set every element they write whatever its value was.
_FILLS = frozenset(
    {torch.ops.aten.fill_.Scalar, torch.ops.aten.fill_.Tensor, torch.ops.aten.zero_.default}
)
_COPY = torch.ops.aten.copy_.default


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
    if len(node.writes) != 1 or not node.leaves:
        return False
    target = node.leaves[0]
    if not isinstance(target, Value) or target.storage is not storage:
        return False
    meta = target.meta
    if meta.offset != 0 or math.prod(meta.size) * meta.dtype.itemsize != storage.nbytes:
        return False
    if not non_overlapping_and_dense(meta.size, meta.stride):
        return False
    op = node.op
    if node.kind == NodeKind.RANDOM:
        schema = getattr(op, "_schema", None)
        first = schema.arguments[0].alias_info if schema is not None and schema.arguments else None
        return first is not None and first.is_write
    if op in _FILLS:
        return True
    if op is _COPY:
        source = node.leaves[1] if len(node.leaves) > 1 else None
        return isinstance(source, Value) and source.storage is not storage
    return False
