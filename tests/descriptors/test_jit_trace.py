"""backend="jit" on code TorchScript cannot script: the validated trace fallback."""

import json
import sys
import zipfile

import pytest
import torch

import torchdefer
from torchdefer.descriptors import DescriptorConflict, DescriptorMismatch, MetaTensorType

F32 = torch.float32
X = {"x": MetaTensorType(["b", "s"], F32, dim_ranges={"s": (1, 64)})}


class Unscriptable(torch.nn.Module):
    """Nested outputs, a value-specialized branch, and a lambda TorchScript rejects."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 3)

    def forward(self, x, flag=False):
        act = (lambda t: t.sigmoid()) if flag else (lambda t: t.tanh())
        y = act(self.lin(x))
        return {"y": y, "parts": [y.sum(-1), x.shape[0] + x[:, :, :2]]}


DESC = {"x": MetaTensorType(["b", "s", 8], F32), "flag": True}


def test_unscriptable_module_is_traced_and_matches_eager_for_lengths_it_was_not_traced_with():
    model = Unscriptable()
    p = torchdefer.script(model, DESC, backend="jit")
    for b, s in [(0, 2), (1, 1), (2, 9), (7, 3)]:
        x = torch.randn(b, s, 8)
        torch.testing.assert_close(p(x, True), model(x, True))


def test_traced_graph_has_refined_inputs_and_no_value_specialized_branch():
    p = torchdefer.script(Unscriptable(), DESC, backend="jit")
    inputs = p.graph.split("):")[0]
    assert "%x : Float(*, *, 8)" in inputs
    assert "flag" not in inputs
    assert "sigmoid" in p.graph
    assert "tanh" not in p.graph


def test_traced_program_checks_every_call():
    p = torchdefer.script(Unscriptable(), DESC, backend="jit")
    with pytest.raises(DescriptorMismatch, match=r"x.shape\[2\]: expected 8, got 7"):
        p(torch.randn(2, 3, 7), True)
    with pytest.raises(DescriptorMismatch, match=r"flag \(value\): expected True, got False"):
        p(torch.randn(2, 3, 8), False)


def test_traced_program_output_descriptors_are_nested_like_the_outputs():
    p = torchdefer.script(Unscriptable(), DESC, backend="jit")
    out = p.output_descriptors
    assert out["y"].shape == ("b", "s", 3)
    assert out["parts"][0].shape == ("b", "s")


def test_traced_program_round_trips_through_save_and_load(tmp_path):
    model = Unscriptable()
    p = torchdefer.script(model, DESC, backend="jit")
    torchdefer.save(p, tmp_path / "traced.tdp")
    q = torchdefer.load(tmp_path / "traced.tdp")
    x = torch.randn(4, 5, 8)
    torch.testing.assert_close(q(x, True), model(x, True))
    assert q.output_descriptors == p.output_descriptors
    assert "%x : Float(*, *, 8)" in q.graph
    assert "tanh" not in q.graph
    with pytest.raises(DescriptorMismatch, match=r"flag \(value\): expected True, got False"):
        q(x, False)


class MeanByLength(torch.nn.Module):
    """float() takes the length out of the trace: it is baked in as a constant."""

    def forward(self, x):
        scale = (lambda n: 1.0 / n)(float(x.shape[1]))
        return x.sum(1) * scale


class OnesOfLength(torch.nn.Module):
    """int() bakes the length into torch.ones; other lengths do not broadcast."""

    def forward(self, x):
        ones = (lambda n: torch.ones(n))(int(x.shape[1]))
        return x + ones


def test_trace_that_bakes_in_a_length_is_refused_at_script_time_with_the_tracer_warning():
    with pytest.raises(TypeError) as e:
        torchdefer.script(MeanByLength(), X, backend="jit")
    message = str(e.value)
    assert "torch.jit.script cannot compile MeanByLength.forward" in message
    assert "does not generalize over the dynamic lengths" in message
    assert "traced with b=3, s=4, then run with b=5, s=6" in message
    assert "outputs differ from the eager model's" in message
    assert "test_jit_trace.py" in message
    assert "Converting a tensor to a Python float" in message
    assert "Use backend='export'" in message
    with pytest.raises(DescriptorConflict, match="'s' is described as symbolic"):
        torchdefer.script(MeanByLength(), X)  # export finds the same line by other means


def test_trace_that_fails_on_other_lengths_is_refused_at_script_time():
    with pytest.raises(
        TypeError,
        match=r"(?s)traced program raised RuntimeError: The size.*"
        "Converting a tensor to a Python integer",
    ):
        torchdefer.script(OnesOfLength(), X, backend="jit")


def test_trace_fallback_asks_to_specialize_int_inputs():
    def scaled(x, n):
        return (lambda t: t * n)(x)

    with pytest.raises(TypeError, match="n is described as int .* give a value to specialize"):
        torchdefer.script(scaled, {"x": MetaTensorType(["b"], F32), "n": int}, backend="jit")
    p = torchdefer.script(scaled, {"x": MetaTensorType(["b"], F32), "n": 3}, backend="jit")
    torch.testing.assert_close(p(torch.ones(5), 3), torch.full((5,), 3.0))


def test_trace_fallback_refuses_non_tensor_outputs_with_advice():
    def with_length(x):
        return (lambda t: t * 2)(x), x.shape[0]

    with pytest.raises(TypeError, match=r"cannot return the int at output\[1\].*backend='export'"):
        torchdefer.script(with_length, {"x": MetaTensorType(["b"], F32)}, backend="jit")


def test_tracing_leaves_the_global_rng_untouched():
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    torchdefer.script(Dropping(), {"x": MetaTensorType(["b"], F32)}, backend="jit")
    torch.testing.assert_close(torch.rand(3), expected)


class Dropping(torch.nn.Module):
    """Random in training mode: validation runs trace and eager on the same draws."""

    def forward(self, x):
        return (lambda t: torch.nn.functional.dropout(t, 0.5, self.training))(x)


def test_loading_a_traced_program_imports_nothing_its_output_structure_names(tmp_path):
    path = tmp_path / "traced.tdp"
    torchdefer.save(torchdefer.script(Unscriptable(), DESC, backend="jit"), path)
    with zipfile.ZipFile(path) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    header = json.loads(files["torchdefer.json"])
    spec = json.loads(header["jit"]["out_spec"])
    spec[1]["type"] = "antigravity.Fly"  # a module whose import has a side effect
    header["jit"]["out_spec"] = json.dumps(spec)
    files["torchdefer.json"] = json.dumps(header).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    with pytest.raises(ValueError, match=r"\['antigravity.Fly'\], not registered"):
        torchdefer.load(path)
    assert "antigravity" not in sys.modules
