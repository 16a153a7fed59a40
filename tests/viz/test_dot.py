"""The graphviz picture: styles, legend, clusters, rendering, and life without `dot`."""

from __future__ import annotations

import importlib.util
import re
import shutil
import xml.etree.ElementTree as ET

import pytest
from torch import nn
from viz_models import Stack, ViewsMutatedAfterTaken, Zoo

import torchdefer
from torchdefer.viz import GraphvizNotFoundError, render, to_dot, to_networkx, write_graph
from torchdefer.viz._style import EDGE_STYLES, NODE_STYLES

needs_graphviz = pytest.mark.skipif(importlib.util.find_spec("graphviz") is None,
                                    reason="needs the graphviz Python package (torchdefer[viz])")
needs_dot = pytest.mark.skipif(shutil.which("dot") is None or not importlib.util.find_spec("graphviz"),
                               reason="Graphviz's dot program or Python package is not installed")
SVG = "{http://www.w3.org/2000/svg}"


def svg_titles(svg: bytes) -> set[str]:
    """Node and cluster names graphviz wrote into the SVG, one <title> each."""
    return {t.text for t in ET.fromstring(svg).iter(f"{SVG}title") if t.text}


@needs_graphviz
def test_each_node_kind_has_its_own_style_and_a_legend_entry():
    source = to_dot(torchdefer.deferred_init(Zoo)).source
    styles = [tuple(sorted(attrs.items())) for attrs, _ in NODE_STYLES.values()]
    assert len(set(styles)) == len(styles)
    for kind, (_, text) in NODE_STYLES.items():
        if kind not in ("real", "elided"):  # Zoo has neither
            assert f"legend_{kind} [label=\"{text}\"" in source, kind
    assert "legend_edge_data_a -> legend_edge_data_b" in source
    assert "legend_edge_mutation_a -> legend_edge_mutation_b" in source


@needs_graphviz
def test_mutation_edges_are_drawn_dashed_red_with_storage_and_version():
    m = torchdefer.deferred_init(ViewsMutatedAfterTaken)
    g = to_networkx(m)
    source = to_dot(m).source
    mutation_style = EDGE_STYLES["mutation"][0]
    for tail, head, d in g.edges(data=True):
        if d["kind"] == "mutation":
            line = next(ln for ln in source.splitlines() if f"{tail} -> {head} [label=\"s#" in ln)
            assert f"s#{d['storage']} v{d['version']}" in line
            assert f"color=\"{mutation_style['color']}\"" in line and "dashed" in line


@needs_graphviz
def test_clusters_follow_module_paths_and_repeats_are_marked_with_their_count():
    m = torchdefer.deferred_init(Stack)
    source = to_dot(m).source
    assert "label=\"layers (ModuleList)\"" in source
    assert f"label=\"0\u2013{len(m.layers) - 1} \u00d7{len(m.layers)} (Block)\"" in source
    assert "label=\"0\u20132 \u00d73 (Expert)\"" in source
    expanded = to_dot(m, collapse_repeats=False).source
    assert not re.search(r'label="[^"]*\u00d7\d+ \(', expanded)  # no cluster says xN
    assert all(f"label=\"{i} (Block)\"" in expanded for i in range(len(m.layers)))


@needs_graphviz
def test_collapsed_picture_draws_only_the_first_of_each_run():
    m = torchdefer.deferred_init(Stack)
    drawn = to_networkx(m, collapse_repeats=True)
    source = to_dot(m).source
    for node in drawn.nodes:
        assert f"\t{node} [" in source
    hidden = set(to_networkx(m).nodes) - set(drawn.nodes)
    assert hidden and not any(f"\t{node} [" in source for node in hidden)


@needs_dot
def test_svg_rendering_shows_every_node_and_module_cluster(tmp_path):
    m = torchdefer.deferred_init(Stack)
    path = write_graph(m, tmp_path / "stack.svg")
    svg = path.read_bytes()
    titles = svg_titles(svg)
    assert set(to_networkx(m, collapse_repeats=True).nodes) <= titles
    text = "".join(ET.fromstring(svg).itertext())
    assert f"\u00d7{len(m.layers)} (Block)" in text
    assert "Legend" in text


@needs_dot
def test_png_is_written_by_extension(tmp_path):
    path = write_graph(torchdefer.deferred_init(nn.Linear, 3, 3), tmp_path / "linear.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_graphviz
def test_dot_file_is_written_and_rendering_explains_install_without_dot(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` anywhere
    m = torchdefer.deferred_init(nn.Linear, 3, 3)
    dot = to_dot(m)
    assert dot.source.startswith("digraph")
    path = write_graph(m, tmp_path / "out" / "linear.dot")
    assert path.read_text() == dot.source
    with pytest.raises(GraphvizNotFoundError, match="apt-get install graphviz"):
        write_graph(m, tmp_path / "linear.svg")
    with pytest.raises(GraphvizNotFoundError, match="write a .dot file"):
        render(dot, "png")
    assert not (tmp_path / "linear.svg").exists()


@needs_graphviz
def test_unknown_extension_is_refused_with_the_formats_that_work(tmp_path):
    m = torchdefer.deferred_init(nn.Linear, 3, 3)
    with pytest.raises(ValueError, match=r"use \.svg, \.png, \.pdf or \.dot"):
        write_graph(m, tmp_path / "graph.docx")
    with pytest.raises(ValueError, match="give it an extension"):
        write_graph(m, tmp_path / "graph")


@needs_graphviz
def test_labels_name_op_shapes_storage_and_source_line():
    m = torchdefer.deferred_init(ViewsMutatedAfterTaken)
    source = to_dot(m).source
    storage = m.col._value.storage.id
    assert f"writes s#{storage} \u2192 v2" in source
    assert "tests/viz/viz_models.py:35" in source  # the line of base.mul_(3.0)
    assert "mul_(%0, other=3)" in source
