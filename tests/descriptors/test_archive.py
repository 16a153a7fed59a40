"""save()/load(): descriptors and checks survive; loading runs no code from the file."""

import io
import json
import os
import pickle
import sys
import zipfile

import pytest
import torch

import torchdefer
from torchdefer._compat import export as compat
from torchdefer.descriptors import DescriptorMismatch, MetaTensorType, ProgramFileError
from torchdefer.descriptors._tree import from_json, normalize, to_json

F32 = torch.float32


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)
        self.register_buffer("shift", torch.randn(4))

    def forward(self, x: torch.Tensor, flag: bool) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.lin(x) + self.shift
        if flag:
            return y.relu(), x[:, :1]
        return y, x


DESC = {"x": MetaTensorType(["b", 6], F32, dim_ranges={"b": (0, 32)}), "flag": True}


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_loaded_program_checks_and_runs_the_same(backend, tmp_path):
    model = Model()
    p = torchdefer.script(model, DESC, backend=backend)
    for b in [0, 1]:  # an export program keeps the graphs these calls build
        p(torch.randn(b, 6), True)
    path = tmp_path / "model.tdp"
    torchdefer.save_program(p, path)
    q = torchdefer.load_program(path, allow_torchscript=backend == "jit")
    for b in [0, 1, 5]:
        x = torch.randn(b, 6)
        torch.testing.assert_close(q(x, True), model(x, True))
    assert q.input_descriptors == p.input_descriptors
    assert q.output_descriptors == p.output_descriptors
    assert "relu" in q.graph
    with pytest.raises(DescriptorMismatch, match=r"x.shape\[0\]: expected 'b' in \[0, 32\], got 33"):
        q(torch.randn(33, 6), True)
    with pytest.raises(DescriptorMismatch, match=r"flag \(value\): expected True, got False"):
        q(torch.randn(2, 6), False)


def test_torchscript_archive_is_refused_unless_allowed(tmp_path):
    path = tmp_path / "model.tdp"
    torchdefer.save_program(torchdefer.script(Model(), DESC, backend="jit"), path)
    with pytest.raises(ProgramFileError, match="holds a TorchScript program .* pass allow_torchscript=True if you trust"):
        torchdefer.load_program(path)


def test_descriptors_are_stored_as_json(tmp_path):
    path = tmp_path / "model.tdp"
    torchdefer.save_program(torchdefer.script(Model(), DESC), path)
    header = json.loads(_members(path)["torchdefer.json"])
    x, flag = header["params"]["tuple"]
    assert from_json(x) == torchdefer.descriptors._tree.Param("x", "POSITIONAL_OR_KEYWORD", DESC["x"], described=True)
    assert x["Param"]["node"]["MetaTensorType"]["dtype"] == {"dtype": "float32"}
    assert flag["Param"]["node"] == {"Value": {"value": True}}


def test_descriptor_trees_round_trip_through_the_file_format():
    d = MetaTensorType(
        ["b", None, 3],
        torch.bfloat16,
        device="cpu",
        requires_grad=False,
        layout=torch.strided,
        dim_ranges={"b": (1, None)},
    )
    tree = normalize({"x": d, "ids": list[int], "mask": MetaTensorType | None, "pair": (float, torch.int8),
                      "dev": torch.device("cuda:1"), "n": None}, "inp")
    for value in (d, tree, MetaTensorType(rank=2), (torch.strided, 1.5, "s", True)):
        encoded = json.loads(json.dumps(to_json(value)))
        assert from_json(encoded) == value


@pytest.mark.parametrize("data", [
    {"TypeOf": {"type": {"dtype": "float32"}}},
    {"MetaTensorType": {"shape": {"tuple": [-1]}}},
    {"dtype": "Tensor"},
    {"Weights": {}},
    {"tree": "[1, {\"type\": \"antigravity.Fly\", \"context\": \"null\", \"children_spec\": []}]", "leaves": []},
])
def test_file_format_builds_only_valid_descriptor_objects(data):
    with pytest.raises((ValueError, TypeError, KeyError, NotImplementedError)):
        from_json(data)


# ------------------------------------------------------------ hostile files
MARK = "torchdefer_test_pwned"
PAYLOAD = f"__import__('builtins').setattr(__import__('sys'), '{MARK}', 1) or Symbol('s77')"


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "model.tdp"
    torchdefer.save_program(torchdefer.script(Model(), DESC), path)
    yield path
    assert not hasattr(sys, MARK), "code from the file ran"


def _members(path):
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _write(path, members, declare=True):
    """Write the archive; ``declare`` updates the header's member sizes, as a crafted file would."""
    header = members.get("torchdefer.json")
    if declare and header is not None:
        try:
            data = json.loads(header)
        except ValueError:
            data = None
        if isinstance(data, dict) and "members" in data:
            data["members"] = {n: len(d) for n, d in members.items() if n != "torchdefer.json"}
            members = {**members, "torchdefer.json": json.dumps(data).encode()}
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in members.items():
            zf.writestr(n, d)


def _edit_json(path, member, edit):
    members = _members(path)
    data = json.loads(members[member])
    edit(data)
    members[member] = json.dumps(data).encode()
    _write(path, members)


def _first_expr(data):
    for value in data["graph_module"]["graph"]["tensor_values"].values():
        for size in value["sizes"]:
            if size.get("as_expr"):
                return size["as_expr"]
    raise AssertionError("no symbolic size in the graph")


def test_crafted_shape_expression_runs_code_in_torchs_loader_but_is_refused_by_ours(saved):
    _edit_json(saved, "graph0.json", lambda g: _first_expr(g).update(expr_str=PAYLOAD))
    members = _members(saved)
    with pytest.raises(ProgramFileError, match=r"graph0.json holds something loading would execute \(BoolOp is not allowed"):
        torchdefer.load_program(saved)
    assert not hasattr(sys, MARK)
    # The hole being closed: torch's own deserializer evaluates the text.
    state = torch.load(io.BytesIO(members["weights.pt"]), weights_only=True)
    try:
        compat.deserialize(members["graph0.json"], state, {})
    except Exception:
        pass
    assert getattr(sys, MARK, None) == 1
    delattr(sys, MARK)


def test_guards_code_that_torch_would_exec_is_refused(saved):
    _edit_json(saved, "graph0.json", lambda g: g.update(guards_code=["__import__('os').getpid()"]))
    with pytest.raises(ProgramFileError, match="carries guards_code, Python source torch would exec"):
        torchdefer.load_program(saved)


def test_graph_node_calling_a_python_function_is_refused(saved):
    def edit(g):
        node = g["graph_module"]["graph"]["nodes"][0]
        node["target"] = "torch.serialization.os.system"

    _edit_json(saved, "graph0.json", edit)
    with pytest.raises(ProgramFileError, match=r"graph0.json: node 'linear' calls torch.serialization.os.system \(from File .*test_archive.py\", line \d+, in forward\), which is outside the allowed operators"):
        torchdefer.load_program(saved)


def test_crafted_coverage_guard_is_refused(saved):
    def edit(h):
        h["variants"][0]["coverage"]["guards"] = [PAYLOAD.replace("s77", "v0")]

    _edit_json(saved, "torchdefer.json", edit)
    with pytest.raises(ProgramFileError, match="graph 0 of torchdefer.json holds something loading would execute"):
        torchdefer.load_program(saved)


def test_output_structure_naming_an_unregistered_type_imports_nothing(saved):
    def edit(h):
        h["variants"][0]["recipe"]["spec"] = json.dumps([1, {"type": "antigravity.Fly", "context": "null", "children_spec": []}])

    _edit_json(saved, "torchdefer.json", edit)
    with pytest.raises(ProgramFileError, match="graph 0 of torchdefer.json is not what torchdefer wrote"):
        torchdefer.load_program(saved)
    assert "antigravity" not in sys.modules


_LEAF = {"type": None, "context": None, "children_spec": []}
# Two of torch's own pytree readers import what a spec names: a defaultdict's
# default_factory, and a dict key written as an enum.
IMPORTING_SPECS = {
    "defaultdict": json.dumps([1, {"type": "collections.defaultdict", "context": {
        "default_factory_module": "tabnanny", "default_factory_name": "check", "dict_context": ["k"]},
        "children_spec": [_LEAF]}]),
    "enum_key": json.dumps([1, {"type": "builtins.dict", "context": json.dumps(
        [{"__enum__": True, "fqn": "tabnanny:NannyNag", "name": "x"}]), "children_spec": [_LEAF]}]),
}


def _spec_in_descriptor(h, spec):
    x = h["params"]["tuple"][0]["Param"]
    x["node"] = {"tree": spec, "leaves": [x["node"]]}


def _spec_in_outputs(h, spec):
    h["variants"][0]["recipe"]["spec"] = spec


@pytest.mark.parametrize("spec", sorted(IMPORTING_SPECS))
@pytest.mark.parametrize("where", ["descriptor", "outputs", "graph"])
def test_pytree_spec_naming_something_to_import_is_refused_before_torch_reads_it(where, spec, saved):
    sys.modules.pop("tabnanny", None)
    text = IMPORTING_SPECS[spec]
    if where == "graph":  # export's own in_spec, read by its deserializer
        _edit_json(saved, "graph0.json", lambda g: g["graph_module"]["module_call_graph"][0]["signature"].update(in_spec=text))
    else:
        _edit_json(saved, "torchdefer.json", lambda h: (_spec_in_descriptor if where == "descriptor" else _spec_in_outputs)(h, text))
    with pytest.raises(ProgramFileError, match="holds something loading would execute .*a pytree spec naming something to import"):
        torchdefer.load_program(saved)
    assert "tabnanny" not in sys.modules


def test_value_that_reads_back_otherwise_is_refused_at_save(tmp_path):
    def f(x, table={(1, 2): 3}):  # noqa: B006 -- a tuple key would load as a list
        return x

    p = torchdefer.script(f, {"x": MetaTensorType(["b"], F32)})
    with pytest.raises(TypeError, match=r"\{\(1, 2\): 3\} \(a dict\) cannot be saved in a program file"):
        torchdefer.save_program(p, tmp_path / "f.tdp")


class _Payload:
    def __reduce__(self):
        return (exec, (f"import sys; setattr(sys, {MARK!r}, 1)",))


@pytest.mark.parametrize("member", ["weights.pt", "graph0.constants.pt"])
def test_crafted_pickle_in_the_archive_is_not_executed(member, saved):
    members = _members(saved)
    buffer = io.BytesIO()
    torch.save({"lin.weight": _Payload()}, buffer)
    for data in (buffer.getvalue(), pickle.dumps(_Payload())):
        members[member] = data
        _write(saved, members)
        with pytest.raises(ProgramFileError, match=f"{member} holds more than tensors, or is damaged; refusing to unpickle it"):
            torchdefer.load_program(saved)


# ------------------------------------------------------------ damaged files
def test_truncated_file_names_the_file_and_the_damage(saved):
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])
    with pytest.raises(ProgramFileError, match=rf"{saved.name}': the archive is damaged or truncated"):
        torchdefer.load_program(saved)


def test_corrupted_member_is_reported_with_its_name(saved):
    data = bytearray(saved.read_bytes())
    start = data.index(b'"graph_module"')  # inside graph0.json's stored bytes
    data[start + 3] ^= 0x55
    saved.write_bytes(bytes(data))
    with pytest.raises(ProgramFileError, match=r"graph0.json is damaged or truncated \(Bad CRC-32"):
        torchdefer.load_program(saved)


@pytest.mark.parametrize("member", ["weights.pt", "graph0.json", "graph0.constants.pt"])
def test_missing_member_is_reported_as_an_incomplete_file(member, saved):
    members = _members(saved)
    del members[member]
    _write(saved, members)
    with pytest.raises(ProgramFileError, match=f"{member} is missing; the file is incomplete"):
        torchdefer.load_program(saved)


def test_header_from_another_version_or_not_json_says_so(saved):
    _edit_json(saved, "torchdefer.json", lambda h: h.update(version=99))
    with pytest.raises(ProgramFileError, match="unsupported version 99; this torchdefer reads torchdefer.program version 3"):
        torchdefer.load_program(saved)
    members = _members(saved)
    members["torchdefer.json"] = b"{not json"
    _write(saved, members)
    with pytest.raises(ProgramFileError, match="torchdefer.json is not what torchdefer wrote"):
        torchdefer.load_program(saved)


def test_loading_a_file_that_is_not_a_program_says_so(tmp_path):
    path = tmp_path / "other.zip"
    _write(path, {"x.txt": "hi"})
    with pytest.raises(ProgramFileError, match="is not a torchdefer program"):
        torchdefer.load_program(os.fspath(path))
    path.write_bytes(b"plain text")
    with pytest.raises(ProgramFileError, match="the archive is damaged or truncated"):
        torchdefer.load_program(path)


def test_outputs_holding_dtypes_devices_and_numbers_save_and_load(tmp_path):
    def f(x):
        return {"y": x * 2, "dtype": x.dtype, "device": x.device, "n": 3}

    path = tmp_path / "f.tdp"
    torchdefer.save_program(torchdefer.script(f, {"x": MetaTensorType(["b", 3], F32)}), path)
    q = torchdefer.load_program(path)
    x = torch.randn(4, 3)
    out = q(x)
    assert (out["dtype"], out["device"], out["n"]) == (F32, torch.device("cpu"), 3)
    assert torch.equal(out["y"], x * 2)


def test_the_old_program_names_still_work_and_warn_with_the_new_ones(tmp_path):
    p = torchdefer.script(lambda x: x * 2, {"x": MetaTensorType(["n"], torch.float32)})
    f = tmp_path / "double.tdp"
    with pytest.warns(DeprecationWarning, match=r"torchdefer.save is renamed "
                                                r"torchdefer.save_program .*torchdefer 0.3"):
        torchdefer.save(p, f)
    with pytest.warns(DeprecationWarning, match=r"torchdefer.load is renamed "
                                                r"torchdefer.load_program"):
        q = torchdefer.load(f)
    assert torch.equal(q(torch.arange(3.0)), torch.arange(3.0) * 2)
    assert "save" not in torchdefer.__all__ and "save_program" in torchdefer.__all__
