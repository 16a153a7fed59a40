"""Loading checks decoded structures, never raw text: pytree specs, names looked
up in torch, and node metadata that torch resolves or prints as code."""

import json
import sys

import pytest
import torch
import torch.utils._pytree as pytree
from crafting import _edit_graph, _filled, _members, _nodes, _write

import torchdefer
from torchdefer.descriptors import ProgramFileError
from torchdefer.descriptors._tree import from_json

MARK = "torchdefer_program_file_safety_pwned"


def _escaped_enum_spec(module="tabnanny"):
    context = json.dumps([{"__enum__": True, "fqn": f"{module}:NannyNag", "name": "x"}])
    context = context.replace("__enum__", "\\u005f_enum__")  # a JSON escape: same key once decoded
    leaf = {"type": None, "context": None, "children_spec": []}
    return json.dumps([1, {"type": "builtins.dict", "context": context, "children_spec": [leaf]}])


def test_enum_key_spelled_with_a_json_escape_imports_in_torchs_reader():
    text = _escaped_enum_spec()
    assert "__enum__" not in text and "__enum__" not in json.loads(text)[1]["context"]
    sys.modules.pop("tabnanny", None)
    try:
        pytree.treespec_loads(text)
    except Exception:
        pass  # NannyNag is no enum; the import happened before that was found
    assert "tabnanny" in sys.modules
    sys.modules.pop("tabnanny")


@pytest.mark.parametrize("where", ["descriptor", "outputs", "in_spec", "out_spec"])
def test_enum_key_spelled_with_a_json_escape_is_refused_before_torch_reads_it(where, filled_file):
    sys.modules.pop("tabnanny", None)
    text = _escaped_enum_spec()
    members = _members(filled_file)
    if where in ("in_spec", "out_spec"):
        graph = json.loads(members["graph0.json"])
        graph["graph_module"]["module_call_graph"][0]["signature"][where] = text
        members["graph0.json"] = json.dumps(graph).encode()
    else:
        header = json.loads(members["torchdefer.json"])
        if where == "descriptor":
            x = header["params"]["tuple"][0]["Param"]
            x["node"] = {"tree": text, "leaves": [x["node"]]}
        else:
            header["variants"][0]["recipe"]["spec"] = text
        members["torchdefer.json"] = json.dumps(header).encode()
    _write(filled_file, members)
    part = "graph0.json" if where.endswith("_spec") else "torchdefer.json"
    with pytest.raises(ProgramFileError, match=rf"{part} holds something loading would execute "
                       r"\(a pytree spec naming something to import \(an enum key naming 'tabnanny:NannyNag'\)"):
        torchdefer.load_program(filled_file)
    assert "tabnanny" not in sys.modules


def test_spec_with_an_unregistered_type_or_another_protocol_says_what_to_do(filled_file):
    def edit(graph):
        signature = graph["graph_module"]["module_call_graph"][0]["signature"]
        signature["out_spec"] = json.dumps([1, {"type": "my.Box", "context": "null", "children_spec": []}])

    _edit_graph(filled_file, edit)
    with pytest.raises(ProgramFileError, match="pytree type 'my.Box' is not registered in this process; register it"):
        torchdefer.load_program(filled_file)


@pytest.mark.parametrize("data", [{"dtype": "onnx"}, {"layout": "_inductor"}, {"dtype": ["float32"]}])
def test_dtype_or_layout_name_from_the_file_never_reaches_torchs_lazy_imports(data, monkeypatch):
    asked = []
    monkeypatch.setattr(torch, "__getattr__", lambda name: asked.append(name), raising=False)
    with pytest.raises((KeyError, TypeError, ValueError)):
        from_json(data)
    assert asked == []


def test_source_fn_stack_naming_a_torch_submodule_imports_nothing(filled_file, monkeypatch):
    """torch resolves these names with getattr from ``torch``, whose lazy
    ``__getattr__`` imports submodules; the loader drops the metadata first."""
    def edit(graph):
        _nodes(graph)[0]["metadata"]["source_fn_stack"] = "zeros,torch.lazy_submodule.x"

    _edit_graph(filled_file, edit)
    asked, lazy = [], torch.__getattr__
    monkeypatch.setattr(torch, "__getattr__", lambda name: asked.append(name) or lazy(name))
    x = torch.arange(4.0)
    assert torch.equal(torchdefer.load_program(filled_file)(x), _filled(x))
    assert "lazy_submodule" not in asked


def test_node_names_and_stack_traces_cannot_break_out_of_fx_generated_code(filled_file):
    """fx generates Python from node names and writes stack traces as comments;
    ``exec`` ends a comment at a lone carriage return."""
    payload = f"__import__('builtins').setattr(__import__('sys'), '{MARK}', 1)"

    def edit(graph):
        for node in _nodes(graph):
            node["metadata"]["stack_trace"] = f'File "a.py", line 1, in f\n    x = 1\r{payload}\r#'
        text = json.dumps(graph).replace('"zeros"', json.dumps(f"zeros = {payload}; zeros"))
        graph.clear()
        graph.update(json.loads(text))

    _edit_graph(filled_file, edit)
    q = torchdefer.load_program(filled_file)
    x = torch.arange(4.0)
    assert torch.equal(q(x), _filled(x))
    runner = next(iter(q._variants.values()))
    readable = runner.program.graph_module.print_readable(print_output=False)
    assert "\r" not in readable and "\r" not in q.graph and not hasattr(sys, MARK)
