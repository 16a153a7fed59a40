"""Crafting program files at test time: a small saved program and ways to edit it
as a hostile or broken file would (no binary blobs in the repository)."""

import json
import os
import zipfile

import torch

import torchdefer
from torchdefer.descriptors import MetaTensorType

__all__ = ["_edit_graph", "_filled", "_from_file", "_members", "_nodes", "_write", "save_filled"]


def _filled(x):
    t = torch.zeros(4, dtype=torch.uint8)
    t.fill_(65)
    return x + t


def _members(path):
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _write(path, members, *, declare=True, compress=None):
    """Write an archive as a crafted file would: header sizes updated unless told not to."""
    if declare:
        header = json.loads(members["torchdefer.json"])
        header["members"] = {n: len(d) for n, d in members.items() if n != "torchdefer.json"}
        members = {**members, "torchdefer.json": json.dumps(header).encode()}
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in members.items():
            zf.writestr(n, d, compress_type=(compress or {}).get(n, zipfile.ZIP_STORED))


def _nodes(graph):
    return graph["graph_module"]["graph"]["nodes"]


def _node(graph, name):
    """The node called ``name``: by its own field (torch >= 2.9's format) or, where
    the format has none (torch 2.8), by its first tensor output's name."""
    def name_of(n):
        if "name" in n:
            return n["name"]
        return next((o["as_tensor"]["name"] for o in n["outputs"] if "as_tensor" in o), None)
    return next(n for n in _nodes(graph) if name_of(n) == name)


def _edit_graph(path, edit, member="graph0.json"):
    members = _members(path)
    graph = json.loads(members[member])
    edit(graph)
    members[member] = json.dumps(graph).encode()
    _write(path, members)


def _from_file(victim):
    """Make the ``zeros`` node read ``victim`` with ``shared=True``; ``fill_`` then writes it."""
    def edit(graph):
        node = next(n for n in _nodes(graph) if n["target"] == "torch.ops.aten.zeros.default")
        node["target"] = "torch.ops.aten.from_file.default"
        node["inputs"] = [{"name": "filename", "arg": {"as_string": os.fspath(victim)}, "kind": 1},
                          {"name": "shared", "arg": {"as_bool": True}, "kind": 1},
                          {"name": "size", "arg": {"as_int": 4}, "kind": 1},
                          {"name": "dtype", "arg": {"as_scalar_type": 1}, "kind": 2}]
    return edit


def save_filled(path):
    """Save the program of :func:`_filled` (``zeros``, ``fill_``, ``add``) to ``path``."""
    torchdefer.save_program(torchdefer.script(_filled, {"x": MetaTensorType([4], torch.float32)}), path)
    return path
