"""Files torchdefer writes name no torchdefer module: renaming a module keeps them loading.

Internal modules may be renamed in any release (docs/ARCHITECTURE.md, "Public
modules"). A program file (``save_program``) or a checkpoint (``save_state_dict``)
that recorded a module path (a pickled class, a pytree type name) would stop
loading after such a rename, or import code by name while loading. Each file
written here is read byte by byte for a dotted ``torchdefer.<package>`` name.
"""

from __future__ import annotations

import re
import zipfile

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.descriptors import MetaTensorType, ObjectOf

# `torchdefer.json` and the `torchdefer.program` format tag are file names, not modules.
MODULE_PATH = re.compile(
    rb"torchdefer\.(?:_?[a-z][a-z_0-9]*\.)*(?:fake|recorder|materialize|checkpoint|distributed"
    rb"|viz|descriptors|rng|errors|_compat|_hooks|_cli)\b")


# torch.export's node metadata names the class of each module on the call stack
# (`torchdefer.descriptors._export_backend._Bound`, the wrapper that binds the
# weights): text for people, which `torch.export.load` keeps as a string and never
# imports (`import_nn_module_stack` in torch/_export/serde/serialize.py).
NN_MODULE_STACK = re.compile(rb'"nn_module_stack": "(?:[^"\\]|\\.)*"')


def _module_paths(data: bytes) -> list[bytes]:
    return sorted(set(MODULE_PATH.findall(NN_MODULE_STACK.sub(b"", data))))


def test_the_pattern_finds_module_paths_and_spares_the_format_names():
    assert _module_paths(b"ctorchdefer.descriptors._object_of\nObjectOf") == [
        b"torchdefer.descriptors"]
    assert _module_paths(b'{"format": "torchdefer.program"} torchdefer.json') == []
    assert _module_paths(b'{"nn_module_stack": "L__self__,,torchdefer.descriptors.x._Bound"}') == []


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"y": self.lin(x) + extra["b"], "x": x}


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_a_program_file_names_no_torchdefer_module(backend, tmp_path):
    desc = {"x": MetaTensorType(["n", 6], torch.float32, dim_ranges={"n": (1, 16)}),
            "extra": {"b": MetaTensorType([4], torch.float32)}}
    program = torchdefer.script(_Model(), desc, backend=backend)
    program(torch.randn(3, 6), {"b": torch.randn(4)})
    path = tmp_path / "model.tdp"
    torchdefer.save_program(program, path)
    with zipfile.ZipFile(path) as zf:
        found = {m: _module_paths(zf.read(m)) for m in zf.namelist()}
    assert not {m: f for m, f in found.items() if f}
    loaded = torchdefer.load_program(path, allow_torchscript=backend == "jit")
    x, b = torch.randn(5, 6), torch.randn(4)
    torch.testing.assert_close(loaded(x, {"b": b}), program(x, {"b": b}))


def test_object_of_descriptors_are_not_written_by_module_path():
    # ObjectOf is registered with pytree without a serialized type name: a treespec
    # holding one cannot be dumped, so its module path never reaches a file.
    pytree = torch.utils._pytree
    spec = pytree.tree_structure(ObjectOf(dict, (pytree.MappingKey("a"),), (1,), None))
    with pytest.raises(Exception, match="serializ"):
        pytree.treespec_dumps(spec)


@pytest.mark.parametrize("format", ["safetensors", "dcp"])
def test_a_checkpoint_names_no_torchdefer_module(format, tmp_path):
    pytest.importorskip("safetensors")
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(nn.Sequential, nn.Linear(8, 4), nn.LayerNorm(4))
    out = torchdefer.save_state_dict(lazy, tmp_path / "ckpt", format=format)
    files = [p for p in out.rglob("*") if p.is_file()] if out.is_dir() else [out]
    assert files
    assert not {p.name: f for p in files if (f := _module_paths(p.read_bytes()))}
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(8, 4), nn.LayerNorm(4))
    fresh = torchdefer.deferred_init(nn.Sequential, nn.Linear(8, 4), nn.LayerNorm(4))
    torchdefer.load_state_dict(fresh, out)
    for (name, a), b in zip(eager.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
