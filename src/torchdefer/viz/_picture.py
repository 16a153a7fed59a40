"""Picture: the part of a recording drawn for some tensors, as plain nodes and links.

Both renderings (graphviz in ``dot.py``, networkx in ``nx.py``) are views of
one :class:`Picture`, so they show the same nodes and edges. An op is in the
picture when replaying some shown tensor needs it (the slice of
``torchdefer.materialize._plan``); it is placed in the module that owns every
tensor needing it (the common prefix of their module paths).

Edges: a *data* edge runs from the op that produced a value to each op (or
tensor) that read it. When the storage read was changed after that value was
produced (an in-place op through another view), a *mutation* edge runs from
the op that wrote the version read, labelled with the storage and version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from torchdefer.errors import UsageError
from torchdefer.materialize._plan import recorded_slice
from torchdefer.recorder._graph import Graph, Node, NodeKind, Value
from torchdefer.recorder._target import target_of
from torchdefer.recorder._tensor import DeferredTensor
from torchdefer.viz._format import (
    DASH,
    TIMES,
    fmt_args,
    fmt_dtype,
    fmt_meta,
    fmt_source,
    node_title,
    rng_text,
    short_repr,
)
from torchdefer.viz._target import Target, common_prefix, describe_real, targets_of

__all__ = ["ELIDED", "REAL", "TENSOR", "Item", "Link", "Picture", "Repeat", "build_picture"]

TENSOR = "tensor"  # a deferred parameter, buffer or tensor that was asked for
REAL = "real"  # one that is already real (materialized, or never deferred)
ELIDED = "elided"  # stands for the ops cut by ``max_nodes``

_REF = re.compile(r"%\d+")


@dataclass(frozen=True, slots=True)
class Item:
    """One node of the picture: a recorded op or a shown tensor."""

    id: str
    kind: str  # a NodeKind, or TENSOR / REAL / ELIDED
    module: str  # module path of the cluster it is drawn in ("" = top level)
    lines: tuple[str, ...]  # label text
    attrs: dict[str, Any]  # exported as networkx node attributes
    form: tuple[Any, ...] = ()  # what two repeated modules must share (no ids, no seq)


@dataclass(frozen=True, slots=True)
class Link:
    """One edge: ``data`` (a value read) or ``mutation`` (a storage written, then read)."""

    tail: str
    head: str
    kind: str
    label: str
    attrs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Repeat:
    """Sibling modules whose recordings are identical, drawn once."""

    members: tuple[str, ...]  # module paths, the first one is drawn

    @property
    def label(self) -> str:
        parent, _, first = self.members[0].rpartition(".")
        last = self.members[-1].rpartition(".")[2]
        prefix = f"{parent}." if parent else ""
        return f"{prefix}{first}{DASH}{last} {TIMES}{len(self.members)}"


@dataclass(slots=True)
class Picture:
    items: dict[str, Item]
    links: list[Link]
    modules: dict[str, str]  # module path -> class name
    repeats: dict[str, Repeat] = field(default_factory=dict)  # drawn member -> run
    folded: int = 0  # ops hidden because a repeat draws them once
    elided: int = 0  # items cut by max_nodes


def build_picture(
    obj: object, *, collapse_repeats: bool = True, max_nodes: int | None = None
) -> Picture:
    """The picture of what was recorded for ``obj`` (see :func:`torchdefer.viz.to_dot`)."""
    targets, modules = targets_of(obj)
    if not any(t.deferred for t in targets):
        raise UsageError(_nothing_deferred(obj, targets))
    picture = _Builder(targets, isinstance(obj, nn.Module)).build(modules)
    if collapse_repeats:
        from torchdefer.viz._repeat import collapse

        picture = collapse(picture)
    if max_nodes is not None:
        picture = limit(picture, max_nodes)
    return picture


def _nothing_deferred(obj: object, targets: list[Target]) -> str:
    if isinstance(obj, nn.Module) and not targets:
        what = f"{type(obj).__name__} has no parameters or buffers"
    elif len(targets) == 1:
        what = f"got a real tensor ({describe_real(targets[0].tensor)}), not a deferred one"
    else:
        what = f"all {len(targets)} tensors given are real"
        if isinstance(obj, nn.Module):
            what = f"all {len(targets)} parameters and buffers of {type(obj).__name__} are real"
    return (
        f"Nothing to draw: {what}, so no recording exists for it (it was never built "
        "by torchdefer.deferred_init, or it was already materialized). Pass a tensor or "
        "module from deferred_init before materializing it."
    )


class _Builder:
    def __init__(self, targets: list[Target], whole_recording: bool) -> None:
        self.targets = targets
        self.whole = whole_recording  # a module: show its data reads too
        self.nodes: dict[int, Node] = {}
        self.owners: dict[int, list[str]] = {}  # id(node) -> modules of tensors needing it
        self.graphs: dict[int, int] = {}
        self.items: dict[str, Item] = {}
        self.links: dict[tuple[str, str, str, str], Link] = {}

    def build(self, modules: dict[str, str]) -> Picture:
        for target in self.targets:
            if target.deferred:
                self._add_slice([target_of(target.tensor).key], target.module)
        for observation in self._observations():
            self._add_slice(list(zip(observation.inputs, observation.reads)), None)
            self._take(observation, None)
        for node in sorted(self.nodes.values(), key=lambda n: (self._graph_index(n), n.seq)):
            self._add_node(node)
        for i, target in enumerate(self.targets):
            self._add_target(f"t{i}", target)
        return Picture(self.items, list(self.links.values()), modules)

    def _observations(self) -> list[Node]:
        graphs: dict[int, Graph] = {}
        for target in self.targets:
            if target.deferred:
                graph = target_of(target.tensor).graph
                graphs[id(graph)] = graph
        found = []
        for graph in graphs.values():
            for node in graph.observations:
                if self.whole or id(node.inputs[0].node) in self.nodes:
                    found.append(node)
        return found

    def _add_slice(self, targets: list[tuple[Value, int]], module: str | None) -> None:
        for node in recorded_slice(targets):
            self._take(node, module)

    def _take(self, node: Node, module: str | None) -> None:
        self.nodes.setdefault(id(node), node)
        owners = self.owners.setdefault(id(node), [])
        if module is not None:
            owners.append(module)

    def _graph_index(self, node: Node) -> int:
        return self.graphs.setdefault(id(node.graph), len(self.graphs))

    def node_id(self, node: Node) -> str:
        k = self._graph_index(node)
        return f"n{node.seq}" if k == 0 else f"g{k}n{node.seq}"

    def _add_node(self, node: Node) -> None:
        owners = self.owners[id(node)]
        module = common_prefix(owners) if owners else ""
        nid = self.node_id(node)
        # The plain string: exports (networkx, GraphML) take no enum members.
        self.items[nid] = Item(nid, node.kind.value, module, _node_lines(node), _node_attrs(node),
                               _node_form(node))
        for index, (value, version) in enumerate(zip(node.inputs, node.reads)):
            self._link_read(value, version, nid, index)

    def _link_read(self, value: Value, version: int, head: str, index: int) -> None:
        storage = value.storage
        tail = self.node_id(value.node)
        label = f"v{version}" if version else ""
        attrs = {"storage": storage.id, "version": version, "input": index}
        self._link(Link(tail, head, "data", label, attrs))
        if version and held_version(value) != version:
            writer = self.node_id(storage.writers[version - 1])
            label = f"s#{storage.id} v{version}"
            self._link(Link(writer, head, "mutation", label, dict(attrs)))

    def _link(self, link: Link) -> None:
        self.links.setdefault((link.tail, link.head, link.kind, link.label), link)

    def _add_target(self, tid: str, target: Target) -> None:
        t = target.tensor
        relative = tuple(_relative(n, target.module) for n in target.names)
        shown = ", ".join(relative[:3]) + (f" +{len(relative) - 3}" if len(relative) > 3 else "")
        what = "Parameter" if isinstance(t, nn.Parameter) else "tensor"
        attrs: dict[str, Any] = {
            "name": target.name, "names": list(target.names), "op": None,
            "shape": tuple(t.shape), "dtype": fmt_dtype(t.dtype), "parameter":
            isinstance(t, nn.Parameter), "requires_grad": t.requires_grad, "source": None,
        }
        form = (relative, tuple(t.shape), t.dtype, isinstance(t, nn.Parameter))
        if not isinstance(t, DeferredTensor):
            attrs.update(device=str(t.device), storage=None, version=None)
            lines = (shown, f"{what} {describe_real(t)}", "real (materialized)")
            self.items[tid] = Item(tid, REAL, target.module, lines, attrs, (*form, t.device))
            return
        value = target_of(t).value
        storage = value.storage
        attrs.update(device=str(value.meta.device), storage=storage.id, version=storage.version)
        lines = (shown, f"{what} {fmt_meta(value.meta)}", f"s#{storage.id} v{storage.version}")
        self.items[tid] = Item(tid, TENSOR, target.module, lines, attrs,
                               (*form, value.meta.device))
        self._link_read(value, storage.version, tid, 0)


def _relative(name: str, module: str) -> str:
    return name[len(module) + 1:] if module and name.startswith(module + ".") else name


def _node_lines(node: Node) -> tuple[str, ...]:
    lines = [f"#{node.seq} {node_title(node)}"]
    for value in node.outputs[:2]:
        lines.append(f"{fmt_meta(value.meta)} · s#{value.storage.id}")
    if len(node.outputs) > 2:
        lines.append(f"+{len(node.outputs) - 2} more outputs")
    for storage, version in node.writes:
        lines.append(f"writes s#{storage.id} → v{version}")
    rng = rng_text(node)
    if rng is not None:
        lines.append(rng)
    source = fmt_source(node.source)
    if source is not None:
        lines.append(source)
    return tuple(lines)


def held_version(value: Value) -> int:
    """The version of its storage a value had when its op produced it.

    A reader that reads a later version sees writes made through other views
    since: that is what a mutation edge shows.
    """
    node = value.node
    for written, version in node.writes:
        if written is value.storage:
            return version
    for other, version in zip(node.inputs, node.reads):
        if other.storage is value.storage:
            return version
    return 0


def node_version(node: Node) -> int | None:
    """The version of its output's storage that a node's output holds."""
    if not node.outputs:
        return node.reads[0] if node.reads else None
    storage = node.outputs[0].storage
    for written, version in node.writes:
        if written is storage:
            return version
    for value, version in zip(node.inputs, node.reads):
        if value.storage is storage:
            return version
    return 0


def _node_attrs(node: Node) -> dict[str, Any]:
    first = node.outputs[0] if node.outputs else (node.inputs[0] if node.inputs else None)
    return {
        "seq": node.seq,
        "op": _op_text(node),
        "args": fmt_args(node),
        "shapes": [tuple(v.meta.size) for v in node.outputs],
        "shape": None if first is None else tuple(first.meta.size),
        "dtype": None if first is None else fmt_dtype(first.meta.dtype),
        "device": None if first is None else str(first.meta.device),
        "storage": None if first is None else first.storage.id,
        "version": node_version(node),
        "writes": [(s.id, v) for s, v in node.writes],
        "rng": rng_text(node),
        "source": fmt_source(node.source),
        "function": None if node.source is None else node.source.function,
        "observed": short_repr(node.payload) if node.kind == NodeKind.OBSERVE else None,
    }


def _op_text(node: Node) -> str | None:
    if node.op is None:
        return None
    if node.kind == NodeKind.OBSERVE:  # a Tensor method (item, tolist), not an OpOverload
        return f"Tensor.{getattr(node.op, '__name__', node.op)}"
    return str(node.op)


def _node_form(node: Node) -> tuple[Any, ...]:
    stream = None if node.rng is None else id(node.rng.stream)
    metas = tuple((v.meta.size, v.meta.stride, v.meta.dtype, v.meta.device) for v in node.outputs)
    return (node.kind, str(node.op), fmt_args_form(node), metas, len(node.writes),
            node.source, stream)


def fmt_args_form(node: Node) -> str:
    """The arguments with tensor references blanked (they differ between repeats)."""
    return _REF.sub("%", fmt_args(node))


def limit(picture: Picture, max_nodes: int) -> Picture:
    """Keep the ``max_nodes`` items nearest to the shown tensors; one node stands for the rest."""
    if max_nodes < 1:
        raise UsageError(f"max_nodes must be at least 1, got {max_nodes}")
    if len(picture.items) <= max_nodes:
        return picture
    preds: dict[str, list[str]] = {}
    for link in picture.links:
        preds.setdefault(link.head, []).append(link.tail)
    order = [i for i, item in picture.items.items() if item.kind in (TENSOR, REAL)]
    order += [i for i, item in picture.items.items() if item.kind == NodeKind.OBSERVE]
    kept: dict[str, None] = {}
    queue = list(order)
    while queue and len(kept) < max_nodes:
        current = queue.pop(0)
        if current in kept:
            continue
        kept[current] = None
        queue.extend(sorted(preds.get(current, ()), key=_seq_of, reverse=True))
    dropped = len(picture.items) - len(kept)
    items = {i: picture.items[i] for i in picture.items if i in kept}
    links = [link for link in picture.links if link.tail in kept and link.head in kept]
    cut = sorted({link.head for link in picture.links
                  if link.head in kept and link.tail not in kept})
    text = f"… {dropped} more recorded ops not shown (max_nodes={max_nodes})"
    items["elided"] = Item("elided", ELIDED, "", (text,), {"op": None, "hidden": dropped})
    links += [Link("elided", head, "data", "", {}) for head in cut]
    return Picture(items, links, picture.modules, picture.repeats, picture.folded, dropped)


def _seq_of(item_id: str) -> int:
    digits = item_id.rpartition("n")[2]
    return int(digits) if digits.isdigit() else -1

