"""save()/load(): descriptors and checks survive; loading runs no pickled code."""

import io
import json
import os
import pickle
import zipfile

import pytest
import torch

import torchdefer
from torchdefer.descriptors import DescriptorMismatch, MetaTensorType

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
    path = tmp_path / "model.tdp"
    torchdefer.save(p, path)
    q = torchdefer.load(path)
    for b in [0, 1, 5]:
        x = torch.randn(b, 6)
        torch.testing.assert_close(q(x, True), model(x, True))
    assert q.input_descriptors == p.input_descriptors
    assert q.output_descriptors == p.output_descriptors
    assert "relu" in q.graph
    with pytest.raises(
        DescriptorMismatch, match=r"x.shape\[0\]: expected 'b' in \[0, 32\], got 33"
    ):
        q(torch.randn(33, 6), True)
    with pytest.raises(DescriptorMismatch, match=r"flag \(value\): expected True, got False"):
        q(torch.randn(2, 6), False)


_RAN = []


class _Payload:
    def __reduce__(self):
        return (_RAN.append, ("pwned",))


def _replace_member(path, member, data):
    with zipfile.ZipFile(path) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    files[member] = data
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)


@pytest.mark.parametrize("member", ["weights.pt", "constants.pt"])
def test_crafted_pickle_in_the_archive_is_not_executed(member, tmp_path):
    path = tmp_path / "model.tdp"
    torchdefer.save(torchdefer.script(Model(), DESC), path)
    buffer = io.BytesIO()
    torch.save({"lin.weight": _Payload()}, buffer)
    _replace_member(path, member, buffer.getvalue())
    with pytest.raises(ValueError, match=f"{member} holds more than tensors; refusing"):
        torchdefer.load(path)
    _replace_member(path, member, pickle.dumps(_Payload()))
    with pytest.raises(ValueError, match="refusing to unpickle"):
        torchdefer.load(path)
    assert _RAN == []


def test_descriptors_are_stored_as_json(tmp_path):
    path = tmp_path / "model.tdp"
    torchdefer.save(torchdefer.script(Model(), DESC), path)
    with zipfile.ZipFile(path) as zf:
        header = json.loads(zf.read("torchdefer.json"))
    trees = dict(header["spec"]["trees"])
    assert trees["x"]["meta"]["shape"] == ["b", 6]
    assert trees["flag"] == {"kind": "value", "value": True}


def test_loading_a_file_that_is_not_a_program_says_so(tmp_path):
    path = tmp_path / "other.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x.txt", "hi")
    with pytest.raises(ValueError, match="is not a torchdefer program"):
        torchdefer.load(os.fspath(path))
