"""The recorded graph: one door for nodes (Graph.add_node), kinds fixed at creation,
frozen value types, and no trace of replay on the graph."""

from __future__ import annotations

import ast
import dataclasses
import gc
import pathlib
import threading
import weakref

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.materialize._cache import cache_for
from torchdefer.recorder._graph import Graph, NodeKind, Placement, SourceLocation
from torchdefer.recorder._rng_placement import RngRecorder

SRC = pathlib.Path(torchdefer.__file__).parent
_WITH_NODES = ("recorder", "materialize", "distributed", "viz", "rng")


def _calls_and_stores():
    """(file, line) of every `Node(...)` call in the package, and of every `x.kind = ...`
    in the packages that handle nodes (checkpoint's sources have a kind of their own)."""
    calls, stores = [], []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Node":
                calls.append((path.relative_to(SRC).as_posix(), node.lineno))
            if (isinstance(node, ast.Attribute) and node.attr == "kind"
                    and isinstance(node.ctx, ast.Store) and path.parent.name in _WITH_NODES):
                stores.append((path.relative_to(SRC).as_posix(), node.lineno))
    return calls, stores


def test_nodes_are_made_only_by_graph_add_node_and_their_kind_is_never_reassigned():
    calls, stores = _calls_and_stores()
    assert [file for file, _ in calls] == ["recorder/_graph.py"]  # inside add_node
    assert stores == []


def test_add_node_numbers_nodes_and_gives_them_the_callers_line_and_settings():
    graph = Graph(RngRecorder())
    line = test_add_node_numbers_nodes_and_gives_them_the_callers_line_and_settings
    first = graph.add_node(NodeKind.FACTORY, torch.ops.aten.zeros.default, [[2]], None, (), (),
                           skip=1)
    with torch.inference_mode():
        second = graph.add_node(NodeKind.CONSTANT, None, [], None, (), (), skip=1)
    seen = graph.add_node(NodeKind.OBSERVE, None, [], None, (), (), skip=1, runs_kernel=False)
    assert (first.seq, second.seq, seen.seq, graph.op_count) == (0, 1, 2, 3)
    assert first.graph is graph and first.kind is NodeKind.FACTORY
    assert first.source.file == __file__ and first.source.function == line.__name__
    assert first.ambient is not None and not first.ambient.inference
    assert second.ambient.inference  # the settings in force when it was made
    assert seen.ambient is None and graph.observations == [seen]


def test_recorded_kinds_are_what_each_op_does():
    def build():
        p = nn.Parameter(torch.empty(3, 3))  # factory, then detach: a view
        p.data.normal_()  # .data, then a random fill
        v = p.detach().t()
        w = v * 2  # a new storage computed from inputs
        w.add_(1)
        c = torch.tensor([1.0, 2.0])
        return p, v, w, c

    p, v, w, c = torchdefer.deferred_init(build)
    assert w._value.node.kind is NodeKind.INPLACE
    assert w._value.node.inputs[0].node.kind is NodeKind.CALL
    assert v._value.node.kind is NodeKind.VIEW
    assert c._value.node.kind is NodeKind.CONSTANT
    writers = p._value.storage.writers
    assert [n.kind for n in writers] == [NodeKind.RANDOM]
    assert writers[0].inputs[0].node.kind is NodeKind.DATA_GET
    assert p._value.storage.creator.kind is NodeKind.FACTORY


def test_a_random_composite_on_meta_is_an_ordinary_write_from_the_start():
    @torchdefer.composite
    def fill_(t):
        t.normal_()
        return t

    t = torchdefer.deferred_init(lambda: fill_(torch.empty(4, device="meta")))
    assert t._value.node.kind is NodeKind.INPLACE and t._value.node.rng is None


def test_node_kinds_print_and_compare_as_their_strings():
    assert NodeKind.RANDOM == "random" and f"{NodeKind.VIEW:<6}|" == "view  |"
    assert str(NodeKind.DATA_GET) == "data_get"


def test_source_locations_and_rng_placements_are_frozen_slotted_values():
    t = torchdefer.deferred_init(torch.randn, 3)
    place, source = t._value.node.rng, t._value.node.source
    assert isinstance(place, Placement) and isinstance(source, SourceLocation)
    assert (place.epoch, place.index) == (0, 0) and place.stream.device == torch.device("cpu")
    for value, field in ((place, "index"), (source, "line")):
        assert not hasattr(value, "__dict__")
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, 1)
    assert str(source) == f"{source.file}:{source.line} in {source.function}"


def test_the_graph_holds_no_replay_cache_and_is_freed_after_materialization():
    m = torchdefer.deferred_init(nn.Linear, 4, 4)
    graph = m.weight._graph
    assert not hasattr(graph, "replay_cache")
    torchdefer.materialize_module(m)  # makes the graph's cache
    ref = weakref.ref(graph)
    del graph
    gc.collect()
    assert ref() is None  # the cache held nothing of it


def test_threads_asking_for_a_graphs_cache_at_once_get_one_cache():
    graph = Graph(RngRecorder())
    barrier = threading.Barrier(8)
    got = []

    def ask():
        barrier.wait()
        got.append(cache_for(graph))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(c is got[0] for c in got)
