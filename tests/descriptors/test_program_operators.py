"""Loaded programs run tensor math only: the operator allowlist of ``_operators``,
on the graph JSON and on the built graph module, against crafted program files;
and programs of real tensor math (export's own examples) still load."""

import copy
import inspect
import io
import json
import re
import subprocess
import sys
import zipfile

import pytest
import torch
import torch.utils._pytree as pytree
from crafting import _edit_graph, _filled, _from_file, _node, _nodes

import torchdefer
from torchdefer.descriptors import MetaTensorType, ProgramFileError
from torchdefer.descriptors._operators import ForbiddenOperator, check_graph_module


@pytest.mark.parametrize("before", [None, b"keep"])
def test_graph_writing_a_file_through_from_file_is_refused_at_load_and_no_file_changes(before, filled_file, tmp_path):
    victim = tmp_path / "victim.bin"
    if before is not None:
        victim.write_bytes(before)
    _edit_graph(filled_file, _from_file(victim))
    with pytest.raises(ProgramFileError, match=(
            rf"{filled_file.name}': graph0.json: node 'zeros' calls aten.from_file.default, which reads "
            r"and writes files.*refusing to load it")):
        torchdefer.load_program(filled_file)
    assert (victim.read_bytes() if victim.exists() else None) == before


def test_torch_export_load_runs_the_same_from_file_graph(tmp_path):
    """The hole closed above, in torch's own loader: it loads, and calling it writes the file."""
    class Filled(torch.nn.Module):
        def forward(self, x):
            return _filled(x)

    buffer = io.BytesIO()
    torch.export.save(torch.export.export(Filled(), (torch.zeros(4),)), buffer)
    victim = tmp_path / "victim.bin"
    members = {n: zipfile.ZipFile(buffer).read(n) for n in zipfile.ZipFile(buffer).namelist()}
    model = next(n for n in members if n.endswith("models/model.json"))
    graph = json.loads(members[model])
    _from_file(victim)(graph)
    members[model] = json.dumps(graph).encode()
    crafted = io.BytesIO()
    with zipfile.ZipFile(crafted, "w") as zf:
        for n, d in members.items():
            zf.writestr(n, d)
    ep = torch.export.load(io.BytesIO(crafted.getvalue()))
    assert not victim.exists()
    ep.module()(torch.zeros(4))
    assert victim.read_bytes() == b"AAAA"


@pytest.mark.parametrize("target, why", [
    ("torch.ops.aten.save.default", "not a tensor operator registered with PyTorch's dispatcher"),
    ("torch.ops.aten.manual_seed.default", "not a tensor operator registered"),
    ("torch.ops.aten._print.default", "writes to the process's standard output"),
    ("torch.ops.aten._pin_memory.default", "pins host memory of the process"),
    ("torch.ops.aten.record_stream.default", "hands memory to a device stream"),
    ("torch.ops.aten.set_.source_Storage", "binds a tensor to a storage from outside the graph"),
    ("torch.ops.aten._cufft_clear_plan_cache.default", "cuFFT plan cache"),
    ("torch.ops.aten._test_warn_in_autograd.default", "an operator for PyTorch's own tests"),
    # memory: each of these, given a crafted stride or index, segfaults eager PyTorch
    ("torch.ops.aten._reshape_alias.default", "makes a view with strides torch does not check"),
    ("torch.ops.aten.sparse_coo_tensor.indices_size", "builds a sparse tensor whose indices torch does not check"),
    ("torch.ops.aten._sparse_coo_tensor_unsafe.default", "builds a sparse tensor whose indices torch does not check"),
    ("torch.ops.aten.max_pool2d_with_indices_backward.default", "is a backward kernel, which trusts the indices"),
    ("torch.ops.aten.no_such_op.default", "not a tensor operator registered"),
    ("torch.ops._c10d_functional.all_reduce.default", "outside the allowed operators"),
    ("torch.ops.mylib.custom.default", "outside the allowed operators"),
    ("torch.ops.prims.device_put.default", "outside the allowed operators"),
    ("torch.ops.higher_order.triton_kernel_wrapper_mutation", "higher-order operator that can call code"),
    ("torch.ops.higher_order.with_effects", "higher-order operator that can call code"),
    ("#mylib:op", "outside the allowed operators"),
    ("builtins.eval", "outside the allowed operators"),
    ("torch._C._set_grad_enabled", "outside the allowed operators"),
])
def test_graph_calling_anything_but_tensor_math_is_refused_naming_node_and_operator(target, why, filled_file):
    def edit(graph):
        _node(graph, "fill_")["target"] = target

    _edit_graph(filled_file, edit)
    shown = target.removeprefix("torch.ops.")
    with pytest.raises(ProgramFileError, match=rf"graph0.json: node 'fill_' calls {re.escape(shown)}, which .*{re.escape(why)}") as e:
        torchdefer.load_program(filled_file)
    assert isinstance(e.value, torchdefer.TorchdeferError) and isinstance(e.value, ValueError)


def test_pin_memory_argument_is_refused(filled_file):
    def edit(graph):
        node = _node(graph, "zeros")
        node["inputs"].append({"name": "pin_memory", "arg": {"as_bool": True}, "kind": 2})

    _edit_graph(filled_file, edit)
    with pytest.raises(ProgramFileError, match=r"node 'zeros' calls aten.zeros.default, which .*pin_memory=True"):
        torchdefer.load_program(filled_file)


def test_operator_passed_as_an_argument_is_refused(filled_file):
    def operator_argument(graph):
        _node(graph, "fill_")["inputs"].append(
            {"name": "op", "arg": {"as_operator": "torch.ops.aten.from_file.default"}, "kind": 2})

    _edit_graph(filled_file, operator_argument)
    with pytest.raises(ProgramFileError, match="an argument names aten.from_file.default, which reads and writes files"):
        torchdefer.load_program(filled_file)


def test_torchbind_object_argument_is_refused(filled_file):
    def torchbind(graph):
        _node(graph, "fill_")["inputs"].append(
            {"name": "obj", "arg": {"as_custom_obj": {"name": "obj0", "class_fqn": "__torch__.torch.classes.x.Y"}}, "kind": 2})

    _edit_graph(filled_file, torchbind)
    with pytest.raises(ProgramFileError, match="graph0.json: an argument is a torchbind object, whose methods are code outside the graph"):
        torchdefer.load_program(filled_file)


def test_built_graph_is_checked_again_subgraphs_included():
    """The second check, on the graph module torch built (the first is on the JSON)."""
    outer = torch.fx.Graph()
    x = outer.placeholder("x")
    outer.output(outer.call_function(torch.ops.aten.add.Tensor, (x, x)))
    inner = torch.fx.Graph()
    inner.output(inner.call_function(torch.ops.aten.from_file.default, ("/tmp/f", True, 4)))
    root = torch.fx.GraphModule(torch.nn.Module(), outer)
    check_graph_module(root)  # tensor math passes
    root.add_module("sub", torch.fx.GraphModule(torch.nn.Module(), inner))
    with pytest.raises(ForbiddenOperator, match="node 'from_file_default' calls aten.from_file.default, which reads and writes files"):
        check_graph_module(root)


class _Branches(torch.nn.Module):
    def forward(self, x, n):
        y = torch.cond(x.sum() > 0, lambda v: v.cos(), lambda v: v.sin(), (x,))
        with torch.no_grad():
            z = x * 2
        k = n.item()
        torch._check(k >= 0)
        torch._check(k <= 4)
        return torch.nn.functional.dropout(y + z, 0.5, training=True)[:k]


def test_cond_no_grad_item_and_dropout_programs_load_and_match_eager(tmp_path):
    model = _Branches()
    descriptors = {"x": MetaTensorType([4], torch.float32, requires_grad=True),
                   "n": MetaTensorType([], torch.int64)}
    torchdefer.save_program(torchdefer.script(model, descriptors), tmp_path / "branches.tdp")
    q = torchdefer.load_program(tmp_path / "branches.tdp")
    graph = q.graph
    assert "cond" in graph and "wrap_with_set_grad_enabled" in graph and "item" in graph
    for sign in (1, -1):
        x, n = sign * torch.rand(4, requires_grad=True) + sign * 0.1, torch.tensor(3)
        torch.manual_seed(0)
        expected = model(x, n)
        torch.manual_seed(0)
        assert torch.equal(q(x, n), expected)


def _static(value):
    return pytree.tree_map(lambda v: MetaTensorType(list(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v, value)


def test_every_export_db_example_that_scripts_saves_loads_and_runs_the_same(tmp_path):
    """PyTorch's own export examples (cond, map, item(), views, in-place ...) are all
    tensor math: the allowlist must let every program built from them load."""
    from torch._export.db.examples import all_examples

    loaded = []
    for name, case in sorted(all_examples().items()):
        arguments = inspect.signature(case.model.forward).bind(*case.example_args, **case.example_kwargs).arguments
        try:
            program = torchdefer.script(case.model, {k: _static(v) for k, v in arguments.items()})
            expected = program(**copy.deepcopy(arguments))  # some examples mutate their inputs
        except Exception:  # what torchdefer cannot script is test_exportdb's business
            continue
        if name == "scalar_output":  # a graph without outputs: torch's serializer cannot write it
            with pytest.raises(TypeError, match="returns only constants .* which torch.export's serializer cannot write"):
                torchdefer.save_program(program, tmp_path / f"{name}.tdp")
            continue
        torchdefer.save_program(program, tmp_path / f"{name}.tdp")
        got = torchdefer.load_program(tmp_path / f"{name}.tdp")(**copy.deepcopy(arguments))
        assert pytree.tree_structure(got) == pytree.tree_structure(expected), name
        for a, b in zip(pytree.tree_leaves(got), pytree.tree_leaves(expected)):
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, name
        loaded.append(name)
    assert len(loaded) >= 20, loaded  # 33 on torch 2.13 (cond, map, item(), mutations ...)


@torch.library.custom_op("torchdefer_test::double", mutates_args=())
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_double.register_fake
def _(x):
    return torch.empty_like(x)


def test_program_calling_a_custom_operator_is_refused_at_save_not_only_at_load(tmp_path):
    p = torchdefer.script(lambda x: _double(x) + 1, {"x": MetaTensorType(["b"], torch.float32)})
    x = torch.arange(3.0)
    assert torch.equal(p(x), x * 2 + 1)  # it runs in the process that registered the operator
    with pytest.raises(TypeError, match=r"save_program\(\): graph 0 of .*: node 'double' calls torchdefer_test.double.default, which is outside the allowed operators.*load_program\(\) would refuse the file"):
        torchdefer.save_program(p, tmp_path / "custom.tdp")
    assert not (tmp_path / "custom.tdp").exists()


def test_forbidden_operator_inside_a_cond_branch_is_found_in_the_json(tmp_path):
    path = tmp_path / "branches.tdp"
    descriptors = {"x": MetaTensorType([4], torch.float32, requires_grad=True), "n": MetaTensorType([], torch.int64)}
    torchdefer.save_program(torchdefer.script(_Branches(), descriptors), path)

    def edit(graph):
        branch = next(a["arg"]["as_graph"]["graph"] for n in _nodes(graph) for a in n["inputs"] if "as_graph" in a["arg"])
        branch["nodes"][0]["target"] = "torch.ops.aten.from_file.default"

    _edit_graph(path, edit)
    with pytest.raises(ProgramFileError, match=r"graph0.json: node 'cos' calls aten.from_file.default \(from File .*test_program_operators.py\", line \d+, in forward\), which reads and writes files"):
        torchdefer.load_program(path)


class _Autocast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.lin(x)
        return y.float() + 1


class _WhileLoop(torch.nn.Module):
    def forward(self, x):
        return torch.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2), (torch.tensor(0), x))[1]


@pytest.mark.parametrize("model, operator", [(_Autocast, "wrap_with_autocast"), (_WhileLoop, "while_loop")])
def test_autocast_and_while_loop_programs_load_and_match_eager(model, operator, tmp_path):
    torch.manual_seed(0)
    m, x = model(), torch.randn(2, 4)
    torchdefer.save_program(torchdefer.script(m, {"x": MetaTensorType([2, 4], torch.float32)}), tmp_path / "p.tdp")
    q = torchdefer.load_program(tmp_path / "p.tdp")
    assert operator in q.graph
    assert torch.equal(q(x), m(x))


_READ_ANYWHERE = '''
import io, json, zipfile, torch
class View(torch.nn.Module):
    def forward(self, x):
        return x.view(2, 2) * 1
buffer = io.BytesIO()
torch.export.save(torch.export.export(View(), (torch.zeros(4),)), buffer)
src = zipfile.ZipFile(buffer)
out = io.BytesIO()
with zipfile.ZipFile(out, "w") as zf:
    for n in src.namelist():
        data = src.read(n)
        if n.endswith("models/model.json"):
            graph = json.loads(data)
            node = next(m for m in graph["graph_module"]["graph"]["nodes"] if "view" in m["target"])
            node["target"] = "torch.ops.aten._reshape_alias.default"
            node["inputs"] = [node["inputs"][0], {"name": "size", "arg": {"as_ints": [2, 2]}, "kind": 1},
                              {"name": "stride", "arg": {"as_ints": [2 ** 40, 1]}, "kind": 1}]
            data = json.dumps(graph).encode()
        zf.writestr(n, data)
print(torch.export.load(io.BytesIO(out.getvalue())).module()(torch.zeros(4)).sum().item())
'''


def test_graph_reading_outside_its_memory_crashes_torch_export_load_and_is_refused_by_ours(tmp_path):
    """The same crafted _reshape_alias: torch.export.load runs it (the process dies
    reading 2**40 elements past its storage); torchdefer.load_program refuses it."""
    crash = subprocess.run([sys.executable, "-c", _READ_ANYWHERE], capture_output=True, timeout=300)
    assert crash.returncode < 0 and b"Traceback" not in crash.stderr, crash.stderr[-2000:]  # a signal
    # Our file: the same node in a torchdefer program.
    path = tmp_path / "view.tdp"
    torchdefer.save_program(torchdefer.script(lambda x: x.view(2, 2) * 1, {"x": MetaTensorType([4], torch.float32)}), path)

    def edit(graph):
        node = next(n for n in _nodes(graph) if "view" in n["target"])
        node["target"] = "torch.ops.aten._reshape_alias.default"
        node["inputs"] = [node["inputs"][0], {"name": "size", "arg": {"as_ints": [2, 2]}, "kind": 1},
                          {"name": "stride", "arg": {"as_ints": [2 ** 40, 1]}, "kind": 1}]

    _edit_graph(path, edit)
    with pytest.raises(ProgramFileError, match="calls aten._reshape_alias.default, which makes a view with strides torch does not check"):
        torchdefer.load_program(path)
