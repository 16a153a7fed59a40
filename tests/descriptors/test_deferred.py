"""Point 8: scripting a deferred module allocates nothing; it runs once materialized."""

import gc
import os

import psutil
import pytest
import torch

import torchdefer
from torchdefer.descriptors import MetaTensorType


class Wide(torch.nn.Module):
    def __init__(self, n=4096):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)
        self.register_buffer("shift", torch.randn(n))

    def forward(self, x):
        return self.lin(x) + self.shift


def rss():
    gc.collect()
    return psutil.Process(os.getpid()).memory_info().rss


DESC = {"x": MetaTensorType(["b", 4096], torch.float32)}


def test_script_of_a_deferred_module_allocates_no_weights(tmp_path):
    torchdefer.script(Wide(8), {"x": MetaTensorType(["b", 8], torch.float32)})  # warm up export
    model = torchdefer.deferred_init(Wide)  # 64 MiB of weights if real
    before = rss()
    p = torchdefer.script(model, DESC)
    torchdefer.save_program(p, tmp_path / "wide.tdp")
    q = torchdefer.load_program(tmp_path / "wide.tdp")
    assert rss() - before < 32 * 2**20
    assert torchdefer.is_deferred(model)
    assert os.path.getsize(tmp_path / "wide.tdp") < 2**20
    assert p.output_descriptors.shape == ("b", 4096)
    (graph,) = q._variants.values()
    assert all(t.is_meta for t in graph.program.state_dict.values())


def test_deferred_program_runs_with_the_real_weights_after_materialize(tmp_path):
    torch.manual_seed(0)
    eager = Wide(16)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(Wide, 16)
    p = torchdefer.script(model, {"x": MetaTensorType(["b", 16], torch.float32)})
    torchdefer.save_program(p, tmp_path / "wide.tdp")
    with pytest.raises(RuntimeError, match=r"has no data .*materialize_module"):
        p(torch.randn(2, 16))
    q = torchdefer.load_program(tmp_path / "wide.tdp")
    with pytest.raises(RuntimeError, match="saved from a deferred model, without weights"):
        q(torch.randn(2, 16))
    torchdefer.materialize_module(model)
    x = torch.randn(3, 16)
    torch.testing.assert_close(p(x), eager(x))
    torch.testing.assert_close(q.with_weights(model)(x), eager(x))
    torch.testing.assert_close(q.with_weights(eager.state_dict())(x), eager(x))


def test_jit_backend_refuses_a_deferred_module_with_advice():
    model = torchdefer.deferred_init(Wide, 8)
    with pytest.raises(TypeError, match="backend='export' \\(no allocation\\)"):
        torchdefer.script(model, {"x": MetaTensorType(["b", 8], torch.float32)}, backend="jit")


def test_weights_bound_without_a_name_the_program_needs_are_refused():
    p = torchdefer.script(Wide(8), {"x": MetaTensorType(["b", 8], torch.float32)})
    state = Wide(8).state_dict()
    del state["shift"]
    with pytest.raises(RuntimeError, match="weight 'shift' is missing from the bound weights"):
        p.with_weights(state)(torch.randn(2, 8))
