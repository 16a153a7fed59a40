"""Program files read as hostile input: only tensor math runs, decoded structures
are checked, zip members are bounded by their headers; every refusal names the
file and the part. Each crafted file is built here, from a file ``save`` wrote."""

import copy
import inspect
import io
import json
import os
import re
import struct
import sys
import tracemalloc
import zipfile
import zlib

import pytest
import torch
import torch.utils._pytree as pytree

import torchdefer
from torchdefer.descriptors import MetaTensorType, ProgramFileError
from torchdefer.descriptors._operators import ForbiddenOperator, check_graph_module
from torchdefer.descriptors._zip import INFLATED_LIMIT
from torchdefer.descriptors.tree import from_json

U8 = torch.uint8


def _filled(x):
    t = torch.zeros(4, dtype=U8)
    t.fill_(65)
    return x + t


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "filled.tdp"
    torchdefer.save(torchdefer.script(_filled, {"x": MetaTensorType([4], torch.float32)}), path)
    return path


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


# ------------------------------------------------------------ operators
@pytest.mark.parametrize("before", [None, b"keep"])
def test_graph_writing_a_file_through_from_file_is_refused_at_load_and_no_file_changes(before, saved, tmp_path):
    victim = tmp_path / "victim.bin"
    if before is not None:
        victim.write_bytes(before)
    _edit_graph(saved, _from_file(victim))
    with pytest.raises(ProgramFileError, match=(
            rf"{saved.name}': graph0.json: node 'zeros' calls aten.from_file.default, which reads "
            r"and writes files.*refusing to load it")):
        torchdefer.load(saved)
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
def test_graph_calling_anything_but_tensor_math_is_refused_naming_node_and_operator(target, why, saved):
    def edit(graph):
        next(n for n in _nodes(graph) if n["name"] == "fill_")["target"] = target

    _edit_graph(saved, edit)
    shown = target.removeprefix("torch.ops.")
    with pytest.raises(ProgramFileError, match=rf"graph0.json: node 'fill_' calls {re.escape(shown)}, which .*{re.escape(why)}") as e:
        torchdefer.load(saved)
    assert isinstance(e.value, torchdefer.TorchdeferError) and isinstance(e.value, ValueError)


def test_pin_memory_argument_is_refused(saved):
    def edit(graph):
        node = next(n for n in _nodes(graph) if n["name"] == "zeros")
        node["inputs"].append({"name": "pin_memory", "arg": {"as_bool": True}, "kind": 2})

    _edit_graph(saved, edit)
    with pytest.raises(ProgramFileError, match=r"node 'zeros' calls aten.zeros.default, which .*pin_memory=True"):
        torchdefer.load(saved)


def test_operator_passed_as_an_argument_is_refused(saved):
    def operator_argument(graph):
        next(n for n in _nodes(graph) if n["name"] == "fill_")["inputs"].append(
            {"name": "op", "arg": {"as_operator": "torch.ops.aten.from_file.default"}, "kind": 2})

    _edit_graph(saved, operator_argument)
    with pytest.raises(ProgramFileError, match="an argument names aten.from_file.default, which reads and writes files"):
        torchdefer.load(saved)


def test_torchbind_object_argument_is_refused(saved):
    def torchbind(graph):
        next(n for n in _nodes(graph) if n["name"] == "fill_")["inputs"].append(
            {"name": "obj", "arg": {"as_custom_obj": {"name": "obj0", "class_fqn": "__torch__.torch.classes.x.Y"}}, "kind": 2})

    _edit_graph(saved, torchbind)
    with pytest.raises(ProgramFileError, match="graph0.json: an argument is a torchbind object, whose methods are code outside the graph"):
        torchdefer.load(saved)


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


# ------------------------------------------------------------ pytree specs, decoded
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
def test_enum_key_spelled_with_a_json_escape_is_refused_before_torch_reads_it(where, saved):
    sys.modules.pop("tabnanny", None)
    text = _escaped_enum_spec()
    members = _members(saved)
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
    _write(saved, members)
    part = "graph0.json" if where.endswith("_spec") else "torchdefer.json"
    with pytest.raises(ProgramFileError, match=rf"{part} holds something loading would execute "
                       r"\(a pytree spec naming something to import \(an enum key naming 'tabnanny:NannyNag'\)"):
        torchdefer.load(saved)
    assert "tabnanny" not in sys.modules


def test_spec_with_an_unregistered_type_or_another_protocol_says_what_to_do(saved):
    def edit(graph):
        signature = graph["graph_module"]["module_call_graph"][0]["signature"]
        signature["out_spec"] = json.dumps([1, {"type": "my.Box", "context": "null", "children_spec": []}])

    _edit_graph(saved, edit)
    with pytest.raises(ProgramFileError, match="pytree type 'my.Box' is not registered in this process; register it"):
        torchdefer.load(saved)


# ------------------------------------------------------------ zip members
def _deflated_zeros(size):
    """A raw deflate stream of ``size`` zero bytes (about 1 MiB per GiB) and its CRC-32."""
    compressor, chunk, crc = zlib.compressobj(1, zlib.DEFLATED, -15), bytes(16 << 20), 0
    parts = []
    for _ in range(size // len(chunk)):
        parts.append(compressor.compress(chunk))
        crc = zlib.crc32(chunk, crc)
    return b"".join(parts) + compressor.flush(), crc


def test_one_gib_zip_bomb_member_is_refused_before_anything_is_inflated(saved):
    members = _members(saved)
    del members["graph0.json"]
    _write(saved, members)
    data, crc = _deflated_zeros(1 << 30)
    info = zipfile.ZipInfo("graph0.json")
    info.compress_type, info.file_size, info.compress_size, info.CRC = zipfile.ZIP_DEFLATED, 1 << 30, len(data), crc
    with zipfile.ZipFile(saved, "a") as zf:  # the member as zipfile would write it, without inflating 1 GiB here
        with zf._lock:
            info.header_offset = zf.fp.tell()
            zf.fp.write(info.FileHeader())
            zf.fp.write(data)
            zf.start_dir = zf.fp.tell()
            zf.filelist.append(info)
            zf.NameToInfo[info.filename] = info
            zf._didModify = True
    assert os.path.getsize(saved) < 8 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ProgramFileError, match=(
                rf"{saved.name}': member 'graph0.json' is compressed and says it inflates to "
                rf"1073741824 bytes, which takes the compressed members past {INFLATED_LIMIT} bytes; refusing")):
            torchdefer.load(saved)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # the file's members only; the bomb was never read


def test_compressed_members_inflating_to_little_still_load(saved):
    members = _members(saved)
    _write(saved, members, compress=dict.fromkeys(members, zipfile.ZIP_DEFLATED))
    x = torch.arange(4.0)
    assert torch.equal(torchdefer.load(saved)(x), _filled(x))


def _patch_central(path, member, **fields):
    """Rewrite fields of ``member``'s central-directory record (a damaged or lying header)."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    with zipfile.ZipFile(path) as zf:
        at = zf.start_dir  # the outer archive's central directory, after every member
    while True:
        length = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46: at + 46 + length] == name:
            break
        at = data.index(b"PK\x01\x02", at + 4)
    offsets = {"compress_size": 20, "file_size": 24, "header_offset": 42}
    for field, value in fields.items():
        struct.pack_into("<I", data, at + offsets[field], value)
    path.write_bytes(bytes(data))


def test_stored_member_claiming_more_bytes_than_it_stores_is_damaged(saved):
    size = _members(saved)["weights.pt"].__len__()
    _patch_central(saved, "weights.pt", file_size=size + 1000)
    with pytest.raises(ProgramFileError, match=r"member 'weights.pt' is stored uncompressed in \d+ bytes but says it holds \d+: the archive is damaged"):
        torchdefer.load(saved)


def test_member_reaching_past_the_end_of_the_archive_is_truncated(saved):
    size = os.path.getsize(saved)
    _patch_central(saved, "weights.pt", file_size=size, compress_size=size)
    with pytest.raises(ProgramFileError, match=rf"member 'weights.pt' says it takes {size} bytes from offset \d+, past the end of the {size}-byte archive"):
        torchdefer.load(saved)


def test_member_cut_short_inside_the_archive_is_reported_with_its_name(saved):
    members = _members(saved)
    longer = len(members["graph0.json"]) + 10
    _patch_central(saved, "graph0.json", file_size=longer, compress_size=longer)
    with pytest.raises(ProgramFileError, match=rf"filled.tdp': member 'graph0.json' holds {longer} bytes, torchdefer.json declares {longer - 10}"):
        torchdefer.load(saved)
    # A file saved before headers declared sizes: zipfile's CRC-32 check names the member.
    header = json.loads(members["torchdefer.json"])
    del header["members"]
    _write(saved, {**members, "torchdefer.json": json.dumps(header).encode()}, declare=False)
    _patch_central(saved, "graph0.json", file_size=longer, compress_size=longer)
    with pytest.raises(ProgramFileError, match=r"filled.tdp': graph0.json is damaged or truncated \(Bad CRC-32 for file 'graph0.json'\)"):
        torchdefer.load(saved)


def test_member_twice_in_the_archive_is_refused(saved):
    members = _members(saved)
    with zipfile.ZipFile(saved, "a") as zf, pytest.warns(UserWarning, match="Duplicate name"):
        zf.writestr("weights.pt", members["weights.pt"])
    with pytest.raises(ProgramFileError, match="member 'weights.pt' appears twice in the archive"):
        torchdefer.load(saved)


def test_member_size_other_than_the_header_declares_is_refused(saved):
    members = _members(saved)
    members["graph0.json"] = members["graph0.json"] + b" "
    _write(saved, members, declare=False)
    with pytest.raises(ProgramFileError, match=r"member 'graph0.json' holds \d+ bytes, torchdefer.json declares \d+: the file was changed after it was saved"):
        torchdefer.load(saved)
    members["extra.bin"] = b"x"
    _write(saved, {**members, "graph0.json": members["graph0.json"][:-1]}, declare=False)
    with pytest.raises(ProgramFileError, match="member 'extra.bin' is not one torchdefer.json declares"):
        torchdefer.load(saved)


def test_compressed_record_inside_the_weights_archive_is_bounded_too(saved):
    members = _members(saved)
    inner = zipfile.ZipFile(io.BytesIO(members["weights.pt"]))
    records = {n: inner.read(n) for n in inner.namelist()}
    pickle_name = next(n for n in records if n.endswith("data.pkl"))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for n, d in records.items():
            zf.writestr(n, d, compress_type=zipfile.ZIP_STORED)
        zf.writestr("archive/data/bomb", bytes(INFLATED_LIMIT + 1), compress_type=zipfile.ZIP_DEFLATED)
    members["weights.pt"] = buffer.getvalue()
    _write(saved, members)
    with pytest.raises(ProgramFileError, match=rf"filled.tdp': weights.pt: member 'archive/data/bomb' is compressed and says it inflates to {INFLATED_LIMIT + 1} bytes"):
        torchdefer.load(saved)
    assert pickle_name  # the rest of the archive was torch's own


def test_fifo_named_like_a_program_is_refused_without_blocking(tmp_path):
    path = tmp_path / "model.tdp"
    os.mkfifo(path)
    with pytest.raises(ProgramFileError, match="model.tdp' is not a regular file"):
        torchdefer.load(path)


# ------------------------------------------------------------ not too narrow
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
    torchdefer.save(torchdefer.script(model, descriptors), tmp_path / "branches.tdp")
    q = torchdefer.load(tmp_path / "branches.tdp")
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
                torchdefer.save(program, tmp_path / f"{name}.tdp")
            continue
        torchdefer.save(program, tmp_path / f"{name}.tdp")
        got = torchdefer.load(tmp_path / f"{name}.tdp")(**copy.deepcopy(arguments))
        assert pytree.tree_structure(got) == pytree.tree_structure(expected), name
        for a, b in zip(pytree.tree_leaves(got), pytree.tree_leaves(expected)):
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, name
        loaded.append(name)
    assert len(loaded) >= 20, loaded  # 33 on torch 2.13 (cond, map, item(), mutations ...)


@pytest.mark.parametrize("data", [{"dtype": "onnx"}, {"layout": "_inductor"}, {"dtype": ["float32"]}])
def test_dtype_or_layout_name_from_the_file_never_reaches_torchs_lazy_imports(data, monkeypatch):
    asked = []
    monkeypatch.setattr(torch, "__getattr__", lambda name: asked.append(name), raising=False)
    with pytest.raises((KeyError, TypeError, ValueError)):
        from_json(data)
    assert asked == []


# ------------------------------------------------------------ allow_torchscript=True
class _Scripted(torch.nn.Module):
    def forward(self, x):
        return x * 2


def _jit_file(tmp_path, edit_code):
    """A jit program file whose TorchScript source is rewritten by ``edit_code``."""
    path = tmp_path / "jit.tdp"
    torchdefer.save(torchdefer.script(_Scripted(), {"x": MetaTensorType(["b"], torch.float32)}, backend="jit"), path)
    members = _members(path)
    inner = zipfile.ZipFile(io.BytesIO(members["program.ts"]))
    records = {n: inner.read(n) for n in inner.namelist()}
    code = next(n for n in records if n.endswith(".py"))  # code/__torch__/<module>.py
    records[code] = edit_code(records[code].decode()).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for n, d in records.items():
            zf.writestr(n, d)
    members["program.ts"] = buffer.getvalue()
    _write(path, members)
    return path


@pytest.mark.parametrize("call, why", [
    ("torch.from_file(\"{victim}\", True, 4)", "calls torch.from_file, which reads and writes files"),
    ("torch.save(x, \"{victim}\")", "calls torch.save, which writes files"),
    ("torch.manual_seed(0)", "calls torch.manual_seed, which reseeds the process's random generator"),
    ("ops.mylib.custom(x)", "calls ops.mylib.custom, an operator outside aten and prim"),
    ("torch.ops.aten.from_file(\"{victim}\", True, 4)", "calls torch.ops.aten.from_file, which reads and writes files"),
    ("x.pin_memory()", "calls x.pin_memory(), which pins host memory of the process"),
])
def test_trusted_torchscript_still_may_not_reach_files_seeds_or_custom_ops(call, why, tmp_path):
    victim = tmp_path / "victim.bin"
    statement = call.format(victim=victim)
    path = _jit_file(tmp_path, lambda code: code.replace("return torch.mul(", f"_9 = {statement}\n    return torch.mul("))
    with pytest.raises(ProgramFileError, match=rf"program.ts: archive/code/__torch__/test_program_file_safety.py, line \d+: {re.escape(why)}.*; even with allow_torchscript=True"):
        torchdefer.load(path, allow_torchscript=True)
    assert not victim.exists()


def test_trusted_torchscript_defining_setstate_is_refused_before_jit_load_runs_it(tmp_path):
    setstate = ("  def __setstate__(self: __torch__.test_program_file_safety._Scripted,\n"
                "    state: Tuple[bool]) -> NoneType:\n"
                "    self.training = state[0]\n    return None\n")
    path = _jit_file(tmp_path, lambda code: code + setstate)
    with pytest.raises(ProgramFileError, match="defines __setstate__, code torch.jit.load would run while loading"):
        torchdefer.load(path, allow_torchscript=True)


def test_trusted_torchscript_with_tensor_code_loads_and_matches_eager(tmp_path):
    path = _jit_file(tmp_path, lambda code: code)
    x = torch.randn(5)
    assert torch.equal(torchdefer.load(path, allow_torchscript=True)(x), _Scripted()(x))


def test_source_fn_stack_naming_a_torch_submodule_imports_nothing(saved, monkeypatch):
    """torch resolves these names with getattr from ``torch``, whose lazy
    ``__getattr__`` imports submodules; the loader drops the metadata first."""
    def edit(graph):
        _nodes(graph)[0]["metadata"]["source_fn_stack"] = "zeros,torch.lazy_submodule.x"

    _edit_graph(saved, edit)
    asked, lazy = [], torch.__getattr__
    monkeypatch.setattr(torch, "__getattr__", lambda name: asked.append(name) or lazy(name))
    x = torch.arange(4.0)
    assert torch.equal(torchdefer.load(saved)(x), _filled(x))
    assert "lazy_submodule" not in asked


def test_node_names_and_stack_traces_cannot_break_out_of_fx_generated_code(saved):
    """fx generates Python from node names and writes stack traces as comments;
    ``exec`` ends a comment at a lone carriage return."""
    payload = f"__import__('builtins').setattr(__import__('sys'), '{MARK}', 1)"

    def edit(graph):
        for node in _nodes(graph):
            node["metadata"]["stack_trace"] = f'File "a.py", line 1, in f\n    x = 1\r{payload}\r#'
        text = json.dumps(graph).replace('"zeros"', json.dumps(f"zeros = {payload}; zeros"))
        graph.clear()
        graph.update(json.loads(text))

    _edit_graph(saved, edit)
    q = torchdefer.load(saved)
    x = torch.arange(4.0)
    assert torch.equal(q(x), _filled(x))
    runner = next(iter(q._variants.values()))
    readable = runner.program.graph_module.print_readable(print_output=False)
    assert "\r" not in readable and "\r" not in q.graph and not hasattr(sys, MARK)


MARK = "torchdefer_program_file_safety_pwned"


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
    with pytest.raises(TypeError, match=r"save\(\): graph 0 of .*: node 'double' calls torchdefer_test.double.default, which is outside the allowed operators.*load\(\) would refuse the file"):
        torchdefer.save(p, tmp_path / "custom.tdp")
    assert not (tmp_path / "custom.tdp").exists()


def test_forbidden_operator_inside_a_cond_branch_is_found_in_the_json(tmp_path):
    path = tmp_path / "branches.tdp"
    descriptors = {"x": MetaTensorType([4], torch.float32, requires_grad=True), "n": MetaTensorType([], torch.int64)}
    torchdefer.save(torchdefer.script(_Branches(), descriptors), path)

    def edit(graph):
        branch = next(a["arg"]["as_graph"]["graph"] for n in _nodes(graph) for a in n["inputs"] if "as_graph" in a["arg"])
        branch["nodes"][0]["target"] = "torch.ops.aten.from_file.default"

    _edit_graph(path, edit)
    with pytest.raises(ProgramFileError, match=r"graph0.json: node 'cos' calls aten.from_file.default \(from File .*test_program_file_safety.py\", line \d+, in forward\), which reads and writes files"):
        torchdefer.load(path)


class _Reseeding(torch.nn.Module):
    def forward(self, x):
        torch.manual_seed(0)
        return x * 2


def test_torchscript_program_reseeding_the_process_is_refused_at_save(tmp_path):
    p = torchdefer.script(_Reseeding(), {"x": MetaTensorType(["b"], torch.float32)}, backend="jit")
    with pytest.raises(TypeError, match=r"save\(\): the TorchScript of _Reseeding.forward: .*calls torch.manual_seed, which reseeds the process's random generator"):
        torchdefer.save(p, tmp_path / "seed.tdp")


def test_missing_file_raises_what_open_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.tdp"):
        torchdefer.load(tmp_path / "nothing.tdp")
    (tmp_path / "folder.tdp").mkdir()
    with pytest.raises(ProgramFileError, match="folder.tdp' is not a regular file"):
        torchdefer.load(tmp_path / "folder.tdp")
