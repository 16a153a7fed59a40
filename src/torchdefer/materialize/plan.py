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

from collections.abc import Callable
from dataclasses import dataclass

import torch

from torchdefer.materialize.cache import ReplayCache
from torchdefer.recorder.graph import Node, Value

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
    expanded: dict[int, int] = {}  # id(storage) -> writers already added: writers[:n]
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
            done = 0
        if version > done:
            nodes.extend(storage.writers[done:version])
            expanded[id(storage)] = version
        else:
            expanded.setdefault(id(storage), done)
        for node in nodes:
            if id(node) not in needed:
                needed[id(node)] = node
                work.extend(zip(node.inputs, node.reads))
    return Plan(sorted(needed.values(), key=lambda n: n.seq), cached)
