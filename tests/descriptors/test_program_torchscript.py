"""``load(..., allow_torchscript=True)`` trusts TorchScript as code, but still
refuses what reaches files, seeds, RPC or custom operators, and ``__setstate__``."""

import io
import re
import zipfile

import pytest
import torch
from crafting import _members, _write

import torchdefer
from torchdefer.descriptors import MetaTensorType, ProgramFileError


class _Scripted(torch.nn.Module):
    def forward(self, x):
        return x * 2


def _jit_file(tmp_path, edit_code):
    """A jit program file whose TorchScript source is rewritten by ``edit_code``."""
    path = tmp_path / "jit.tdp"
    torchdefer.save_program(torchdefer.script(_Scripted(), {"x": MetaTensorType(["b"], torch.float32)}, backend="jit"), path)
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
    with pytest.raises(ProgramFileError, match=rf"program.ts: archive/code/__torch__/test_program_torchscript.py, line \d+: {re.escape(why)}.*; even with allow_torchscript=True"):
        torchdefer.load_program(path, allow_torchscript=True)
    assert not victim.exists()


def test_trusted_torchscript_defining_setstate_is_refused_before_jit_load_runs_it(tmp_path):
    setstate = ("  def __setstate__(self: __torch__.test_program_torchscript._Scripted,\n"
                "    state: Tuple[bool]) -> NoneType:\n"
                "    self.training = state[0]\n    return None\n")
    path = _jit_file(tmp_path, lambda code: code + setstate)
    with pytest.raises(ProgramFileError, match="defines __setstate__, code torch.jit.load would run while loading"):
        torchdefer.load_program(path, allow_torchscript=True)


def test_trusted_torchscript_with_tensor_code_loads_and_matches_eager(tmp_path):
    path = _jit_file(tmp_path, lambda code: code)
    x = torch.randn(5)
    assert torch.equal(torchdefer.load_program(path, allow_torchscript=True)(x), _Scripted()(x))


class _Reseeding(torch.nn.Module):
    def forward(self, x):
        torch.manual_seed(0)
        return x * 2


def test_torchscript_program_reseeding_the_process_is_refused_at_save(tmp_path):
    p = torchdefer.script(_Reseeding(), {"x": MetaTensorType(["b"], torch.float32)}, backend="jit")
    with pytest.raises(TypeError, match=r"save_program\(\): the TorchScript of _Reseeding.forward: .*calls torch.manual_seed, which reseeds the process's random generator"):
        torchdefer.save_program(p, tmp_path / "seed.tdp")
