"""A recorded node's tensors: its arguments as deferred tensors, its new outputs.

What ``record_call``, its fast paths (``recorder._fast``) and composites
(``recorder._composite``) share around :meth:`Graph.add_node
<torchdefer.recorder._graph.Graph.add_node>`: a real tensor among the
arguments becomes an ``EXTERNAL`` node, checked for changes at replay; a new
output becomes a deferred tensor over its :class:`Value`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from torchdefer import _compat
from torchdefer.errors import RecordingError
from torchdefer.fake._layout import meta_twin
from torchdefer.fake._source import user_frame
from torchdefer.fake._tensor import FakeTensor
from torchdefer.recorder._external import ExternalRef
from torchdefer.recorder._graph import Graph, Node, NodeKind, Storage, TensorMeta, Value
from torchdefer.recorder._mode import suspended
from torchdefer.recorder._storage_versions import write
from torchdefer.recorder._tensor import DeferredTensor

__all__ = ["as_deferred", "external", "generator_of", "new_output", "record_writes", "where",
           "written_tensors"]

# The storage's address; a fake tensor's storage is its meta storage.
_storage_id = _compat.storage_id


def as_deferred(graph: Graph, x: torch.Tensor, func: Any) -> DeferredTensor:
    """``x``, an argument of ``func``, as a deferred tensor of ``graph``."""
    if isinstance(x, DeferredTensor):
        if x._graph is not graph:
            raise RecordingError(
                f"{func} mixes tensors from two different deferred_init calls. Build "
                "them in one deferred_init call, or materialize one side first."
            )
        return x
    if isinstance(x, FakeTensor):
        raise RecordingError(
            f"{func} got a fake tensor from torchdefer.fake_mode, which records nothing, "
            "so its value can never be materialized. Create it inside deferred_init."
        )
    return external(graph, x)


def external(graph: Graph, real: torch.Tensor) -> DeferredTensor:
    """A stand-in for a real tensor from outside, checked for changes at replay."""
    known = graph.externals.get(id(real))
    if known is not None and known[0] is real:
        return known[1]
    node = graph.add_node(NodeKind.EXTERNAL, None, [], None, (), (), skip=3, runs_kernel=False)
    with suspended():  # the digest reads the real tensor's bytes
        node.payload = ExternalRef.of(real)
    fake = new_output(graph, node, 0, meta_twin(real), real.device, None)
    graph.externals[id(real)] = (real, fake)
    return fake


def new_output(graph: Graph, node: Node, index: int, elem: torch.Tensor, device: torch.device,
               storage: Storage | None) -> DeferredTensor:
    """Output ``index`` of ``node``: a deferred tensor around the meta tensor ``elem``,
    over ``storage`` (None: a new one)."""
    fake = DeferredTensor(elem, device)
    if storage is None:
        storage = graph.new_storage(node, elem.untyped_storage().nbytes())
        graph.holders[_storage_id(fake)] = fake
    fake._graph = graph
    fake._value = Value(node, index, storage, TensorMeta.of(elem, device))
    node.outputs.append(fake._value)
    return fake


def written_tensors(values: list[Any], written: tuple[int, ...]) -> Iterator[DeferredTensor]:
    """The deferred tensors among ``values[i]`` for ``i`` in ``written`` (lists looked into)."""
    for i in written:
        targets = values[i] if isinstance(values[i], (list, tuple)) else [values[i]]
        for t in targets:
            if isinstance(t, DeferredTensor):
                yield t


def record_writes(node: Node, values: list[Any], written: tuple[int, ...]
                  ) -> tuple[tuple[Storage, int], ...]:
    """A new version of each storage ``node`` writes (``written_tensors``)."""
    return tuple(write(node, t._value.storage) for t in written_tensors(values, written))


def generator_of(kwargs: dict, flat: list) -> torch.Generator | None:
    """The generator a call draws from explicitly (``generator=`` or positional), if any."""
    generator = kwargs.get("generator")
    if generator is None:
        generator = next((x for x in flat if isinstance(x, torch.Generator)), None)
    return generator


def where(skip: int = 0) -> str:
    """The user's line that called the op recorded now (``skip`` more frames up)."""
    frame = user_frame(3 + skip)
    return "<unknown location>" if frame is None else str(frame)
