"""How each kind of node and edge is drawn, and the legend that says so."""

from __future__ import annotations

from typing import Any

from torchdefer.recorder._graph import NodeKind
from torchdefer.viz._picture import ELIDED, REAL, TENSOR

__all__ = ["EDGE_STYLES", "NODE_STYLES", "cluster_style", "legend"]

# kind -> (graphviz node attributes, legend text)
NODE_STYLES: dict[str, tuple[dict[str, str], str]] = {
    NodeKind.FACTORY: (
        {"shape": "box", "style": "rounded,filled", "fillcolor": "#dbeafe"},
        "factory: a new tensor from nothing (empty, zeros, arange)",
    ),
    NodeKind.RANDOM: (
        {"shape": "box", "style": "rounded,filled", "fillcolor": "#fde68a"},
        "random: draws from a generator (named, with its draw number)",
    ),
    NodeKind.VIEW: (
        {"shape": "box", "style": "rounded,dashed", "color": "#6b7280"},
        "view: shares its input's storage (view, t, slicing, detach)",
    ),
    NodeKind.INPLACE: (
        {"shape": "box", "style": "filled,bold", "fillcolor": "#fecaca", "color": "#b91c1c",
         "penwidth": "2"},
        "in-place: mutates a storage (new version), seen by all its views",
    ),
    NodeKind.CALL: (
        {"shape": "box", "style": "rounded"},
        "op: a new tensor computed from its inputs",
    ),
    NodeKind.CONSTANT: (
        {"shape": "note", "style": "filled", "fillcolor": "#e5e7eb"},
        "constant: kept by value (torch.tensor data, or a nonzero/mask result)",
    ),
    NodeKind.EXTERNAL: (
        {"shape": "box3d", "style": "filled", "fillcolor": "#e9d5ff"},
        "external: a real tensor from outside, checked for changes at replay",
    ),
    NodeKind.DATA_GET: (
        {"shape": "cds", "style": "filled", "fillcolor": "#d1fae5"},
        ".data get: the tensor's data without autograd",
    ),
    NodeKind.DATA_SET: (
        {"shape": "cds", "style": "filled,bold", "fillcolor": "#6ee7b7"},
        ".data set: the tensor now holds another value",
    ),
    NodeKind.OBSERVE: (
        {"shape": "hexagon", "style": "filled", "fillcolor": "#fdba74"},
        "data-dependent read (.item(), nonzero, masks): computed while recording",
    ),
    TENSOR: (
        {"shape": "tab", "style": "filled,bold", "fillcolor": "#bbf7d0", "penwidth": "1.5"},
        "deferred parameter / buffer / tensor (storage s#, version v)",
    ),
    REAL: (
        {"shape": "tab", "style": "filled", "fillcolor": "#334155", "fontcolor": "white"},
        "real tensor: already materialized (nothing recorded to show)",
    ),
    ELIDED: (
        {"shape": "plaintext", "fontcolor": "#6b7280"},
        "ops left out by max_nodes",
    ),
}

EDGE_STYLES: dict[str, tuple[dict[str, str], str]] = {
    "data": ({"color": "#374151", "fontsize": "8"}, "reads (label: storage version read)"),
    "mutation": (
        {"color": "#dc2626", "fontcolor": "#dc2626", "style": "dashed", "penwidth": "1.5",
         "fontsize": "8"},
        "mutation: this storage version was written here, then read there",
    ),
}


def cluster_style(repeated: bool) -> dict[str, str]:
    if repeated:
        return {"style": "rounded,filled,bold", "fillcolor": "#fef9c3", "color": "#a16207",
                "penwidth": "2"}
    return {"style": "rounded", "color": "#9ca3af"}


def legend(graph: Any, kinds: set[str], edge_kinds: set[str]) -> None:
    """A ``Legend`` cluster with one sample per node and edge kind present."""
    with graph.subgraph(name="cluster_legend") as sub:
        sub.attr(label="Legend", style="rounded", color="#9ca3af", fontsize="11")
        previous = None
        for kind, (attrs, text) in NODE_STYLES.items():
            if kind not in kinds:
                continue
            name = f"legend_{kind}"
            sub.node(name, text, **attrs)
            if previous is not None:  # stack the samples; the edges are invisible
                sub.edge(previous, name, style="invis")
            previous = name
        for kind, (attrs, text) in EDGE_STYLES.items():
            if kind not in edge_kinds:
                continue
            tail, head = f"legend_edge_{kind}_a", f"legend_edge_{kind}_b"
            sub.node(tail, "", shape="point")
            sub.node(head, "", shape="point")
            sub.edge(tail, head, label=text, **attrs)
