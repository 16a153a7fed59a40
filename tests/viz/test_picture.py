"""The structure of the recorded graph, checked through to_networkx."""

from __future__ import annotations

import networkx as nx
import pytest
import torch
from torch import nn
from viz_models import Stack, ViewsMutatedAfterTaken, Zoo

import torchdefer
from torchdefer.recorder import NodeKind
from torchdefer.viz import to_networkx

ALL_KINDS = {
    NodeKind.FACTORY, NodeKind.RANDOM, NodeKind.VIEW, NodeKind.INPLACE, NodeKind.CALL,
    NodeKind.CONSTANT, NodeKind.EXTERNAL, NodeKind.DATA_GET, NodeKind.DATA_SET,
    NodeKind.OBSERVE,
}


def tensor_nodes(g: nx.MultiDiGraph) -> dict[str, dict]:
    """name -> attributes of the nodes that stand for the tensors asked about."""
    return {d["name"]: d for _, d in g.nodes(data=True) if d["kind"] in ("tensor", "real")}


def node_of(g: nx.MultiDiGraph, name: str) -> str:
    return next(n for n, d in g.nodes(data=True) if d.get("name") == name)


def test_linear_graph_has_one_tensor_node_per_parameter_matching_eager():
    eager = nn.Linear(8, 3)
    g = to_networkx(torchdefer.deferred_init(nn.Linear, 8, 3))
    tensors = tensor_nodes(g)
    assert set(tensors) == {name for name, _ in eager.named_parameters()}
    for name, p in eager.named_parameters():
        assert tensors[name]["shape"] == tuple(p.shape)
        assert tensors[name]["dtype"] == str(p.dtype).removeprefix("torch.")
        assert tensors[name]["parameter"] is True
    assert nx.is_directed_acyclic_graph(g)


def test_every_node_and_edge_carries_the_documented_attributes():
    g = to_networkx(torchdefer.deferred_init(Zoo))
    for _, d in g.nodes(data=True):
        for key in ("kind", "op", "shape", "dtype", "device", "storage", "version", "source",
                    "module", "label"):
            assert key in d, key
    ops = [d for _, d in g.nodes(data=True) if d["kind"] in ALL_KINDS]
    assert all(d["source"] and d["source"].startswith("tests/viz/viz_models.py:") for d in ops)
    for _, _, d in g.edges(data=True):
        assert d["kind"] in ("data", "mutation")
        assert {"storage", "version", "label"} <= set(d)


def test_every_node_kind_is_recorded_and_exported():
    g = to_networkx(torchdefer.deferred_init(Zoo))
    assert {d["kind"] for _, d in g.nodes(data=True)} == ALL_KINDS | {"tensor"}


def test_random_nodes_name_their_generator_and_draw():
    g = to_networkx(torchdefer.deferred_init(nn.Linear, 4, 4))
    draws = sorted(d["rng"] for _, d in g.nodes(data=True) if d["kind"] == NodeKind.RANDOM)
    assert draws == ["generator default cpu, draw 0", "generator default cpu, draw 1"]


def test_explicit_generator_is_named_in_random_nodes():
    gen = torch.Generator().manual_seed(3)
    t = torchdefer.deferred_init(lambda: torch.randn(3, generator=gen))
    (rng,) = [d["rng"] for _, d in to_networkx(t).nodes(data=True) if d["rng"]]
    assert rng == "generator #0 (initial seed 3) on cpu, draw 0"


def test_data_reads_are_shown_with_the_value_they_observed():
    g = to_networkx(torchdefer.deferred_init(Zoo))
    (observed,) = [d for _, d in g.nodes(data=True) if d["kind"] == NodeKind.OBSERVE]
    assert observed["op"] == "Tensor.item"
    assert observed["observed"] == repr(int(torch.arange(3).sum().item()))
    # The read's own inputs are drawn, so one sees what it computed from.
    obs = next(n for n, d in g.nodes(data=True) if d["kind"] == NodeKind.OBSERVE)
    assert {g.nodes[a]["op"] for a in nx.ancestors(g, obs)} == {
        "aten.arange.default", "aten.sum.default"}


def test_write_through_a_data_view_is_a_mutation_edge_into_the_parameter():
    m = torchdefer.deferred_init(Zoo)
    g = to_networkx(m)
    bias = node_of(g, "lin.bias")
    storage = m.lin.bias._value.storage
    (edge,) = [(a, d) for a, _, d in g.in_edges(bias, data=True) if d["kind"] == "mutation"]
    writer, attrs = edge
    assert g.nodes[writer]["op"] == "aten.fill_.Scalar"
    assert attrs["storage"] == storage.id and attrs["version"] == storage.version
    data_get = [a for a in nx.ancestors(g, writer) if g.nodes[a]["kind"] == NodeKind.DATA_GET]
    assert len(data_get) == 1


def test_views_mutated_after_they_were_taken_get_mutation_edges_with_versions():
    m = torchdefer.deferred_init(ViewsMutatedAfterTaken)
    g = to_networkx(m)
    storage = m.col._value.storage
    for name in ("col", "row"):
        node = node_of(g, name)
        assert g.nodes[node]["version"] == storage.version
        writers = [a for a, _, d in g.in_edges(node, data=True) if d["kind"] == "mutation"]
        assert [g.nodes[w]["op"] for w in writers] == ["aten.mul_.Tensor"]
    # The two writes to the shared storage are chained, version by version.
    writes = sorted(
        (d["writes"], d["op"]) for _, d in g.nodes(data=True) if d["kind"] == NodeKind.INPLACE
    )
    assert writes == [([(storage.id, 1)], "aten.add_.Tensor"),
                      ([(storage.id, 2)], "aten.mul_.Tensor")]
    add = node_of_op(g, "aten.add_.Tensor")
    mul = node_of_op(g, "aten.mul_.Tensor")
    assert any(d["kind"] == "mutation" and d["version"] == 1
               for d in g.get_edge_data(add, mul).values())


def node_of_op(g: nx.MultiDiGraph, op: str) -> str:
    return next(n for n, d in g.nodes(data=True) if d["op"] == op)


def test_the_graph_holds_exactly_the_ops_replay_needs():
    m = torchdefer.deferred_init(ViewsMutatedAfterTaken)
    g = to_networkx(m.col)
    ops = sorted(d["seq"] for _, d in g.nodes(data=True) if d.get("seq") is not None)
    # Every op recorded writes or creates the storage `col` views: all are needed.
    assert ops == list(range(m.col._graph.op_count))


def test_ops_are_clustered_by_the_module_that_owns_their_tensors():
    m = torchdefer.deferred_init(Stack)
    g = to_networkx(m)
    for name, _ in m.named_parameters():
        node = node_of_name(g, name)
        module = name.rpartition(".")[0]
        for ancestor in nx.ancestors(g, node):
            assert g.nodes[ancestor]["module"] == g.nodes[node]["module"]
        if name not in ("embed.weight",):
            assert g.nodes[node]["module"] == module
    assert g.graph["modules"]["layers.2.experts.1"] == "Expert"


def node_of_name(g: nx.MultiDiGraph, name: str) -> str:
    return next(n for n, d in g.nodes(data=True) if name in (d.get("names") or ()))


def test_tied_weights_are_one_node_with_both_names_in_their_common_module():
    m = torchdefer.deferred_init(Stack)
    g = to_networkx(m)
    (tied,) = [d for _, d in g.nodes(data=True) if len(d.get("names") or ()) > 1]
    assert tied["names"] == ["embed.weight", "head.weight"]
    assert tied["module"] == ""


def test_identical_layers_collapse_into_one_cluster_nested_repeats_too():
    m = torchdefer.deferred_init(Stack)
    full = to_networkx(m)
    folded = to_networkx(m, collapse_repeats=True)
    layers = [f"layers.{i}" for i in range(len(m.layers))]
    experts = [f"layers.0.experts.{i}" for i in range(len(m.layers[0].experts))]
    assert folded.graph["repeats"] == {"layers.0": layers, "layers.0.experts.0": experts}

    def kept(module: str) -> bool:
        under = lambda p: module == p or module.startswith(p + ".")  # noqa: E731
        hidden = [p for p in layers[1:] + experts[1:] if under(p)]
        return not hidden

    expected = {n for n, d in full.nodes(data=True) if kept(d["module"])}
    assert set(folded.nodes) == expected
    assert all(d["repeat"] == len(layers)
               for _, d in folded.nodes(data=True) if d["module"].startswith("layers.0.norm"))


def test_layers_that_differ_break_the_run_of_repeats():
    m = torchdefer.deferred_init(Stack, (4, 4, 8, 4, 4))
    repeats = to_networkx(m, collapse_repeats=True).graph["repeats"]
    runs = {k: v for k, v in repeats.items() if "experts" not in k}
    assert runs == {"layers.0": ["layers.0", "layers.1"], "layers.3": ["layers.3", "layers.4"]}


def test_layers_with_different_init_are_not_collapsed():
    def build():
        m = Stack()
        with torch.no_grad():
            m.layers[1].proj.weight.mul_(2.0)
        return m

    repeats = to_networkx(torchdefer.deferred_init(build), collapse_repeats=True).graph["repeats"]
    assert repeats.get("layers.0") is None
    assert repeats["layers.2"] == ["layers.2", "layers.3", "layers.4"]


def test_partly_materialized_module_shows_materialized_tensors_as_real():
    m = torchdefer.deferred_init(Stack)
    torchdefer.materialize_module(m.layers[1])
    g = to_networkx(m)
    tensors = tensor_nodes(g)
    for name, t in [*m.named_parameters(), *m.named_buffers()]:
        expected = "tensor" if torchdefer.is_deferred(t) else "real"
        assert tensors[name]["kind"] == expected, name
    real = [n for n, d in g.nodes(data=True) if d["kind"] == "real"]
    assert real and all(g.in_degree(n) == 0 for n in real)


def test_real_tensor_is_refused_plainly():
    with pytest.raises(ValueError, match="got a real tensor \\(3\u00d72 float32 on cpu\\)"):
        to_networkx(torch.zeros(3, 2))
    m = torchdefer.materialize_module(torchdefer.deferred_init(nn.Linear, 2, 2))
    with pytest.raises(ValueError, match="all 2 parameters and buffers of Linear are real"):
        to_networkx(m)


def test_anything_but_tensors_and_modules_is_a_type_error():
    with pytest.raises(TypeError, match="expects a deferred tensor"):
        to_networkx("weight")


def test_max_nodes_keeps_the_nodes_nearest_the_tensors_and_says_how_many_were_cut():
    m = torchdefer.deferred_init(Stack)
    full = to_networkx(m)
    small = to_networkx(m, max_nodes=10)
    assert small.number_of_nodes() == 11  # ten kept, one for the rest
    assert small.nodes["elided"]["hidden"] == full.number_of_nodes() - 10
    assert "tensor" in {d["kind"] for _, d in small.nodes(data=True)}


def test_list_of_tensors_from_two_recordings_are_drawn_side_by_side():
    a = torchdefer.deferred_init(torch.randn, 3)
    b = torchdefer.deferred_init(torch.zeros, 2)
    g = to_networkx([a, b])
    assert set(tensor_nodes(g)) == {"tensor[0]", "tensor[1]"}
    assert nx.number_weakly_connected_components(g) == 2
