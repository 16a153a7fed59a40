"""backend="jit": right answers, or refusals at script() time that say what to do."""

import functools

import pytest
import torch

import torchdefer
from torchdefer.descriptors import DescriptorMismatch, MetaTensorType

F32 = torch.float32
X = {"x": MetaTensorType(["b", 3], F32)}


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_reassigned_parameter_is_used_by_the_next_call():
    model = Linear()
    p = torchdefer.script(model, X, backend="jit")
    x = torch.randn(2, 3)
    model.lin.weight = torch.nn.Parameter(torch.randn(3, 3))
    torch.testing.assert_close(p(x), model(x))
    with torch.no_grad():
        model.lin.bias.add_(1)
    torch.testing.assert_close(p(x), model(x))


def test_replaced_submodule_is_refused_at_call_time():
    model = Linear()
    p = torchdefer.script(model, X, backend="jit")
    model.lin = torch.nn.Linear(3, 3)
    with pytest.raises(RuntimeError, match="submodule 'lin' was replaced after script\\(\\); script the model again"):
        p(torch.randn(2, 3))


def doubled(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) * 2

    return wrapper


class Decorated(torch.nn.Module):
    @doubled
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def test_decorated_forward_is_refused_by_jit_and_right_on_export():
    with pytest.raises(TypeError, match=r"is decorated \(functools.wraps\); TorchScript compiles the undecorated source"):
        torchdefer.script(Decorated(), X, backend="jit")
    p = torchdefer.script(Decorated(), X)
    x = torch.randn(2, 3)
    torch.testing.assert_close(p(x), Decorated()(x))


def test_forward_set_on_the_instance_is_refused_by_jit():
    model = Linear()
    model.forward = lambda x: x * 3
    with pytest.raises(TypeError, match="is an instance attribute, which TorchScript ignores"):
        torchdefer.script(model, X, backend="jit")


class TensorDefault(torch.nn.Module):
    def forward(self, x: torch.Tensor, bias: torch.Tensor = torch.ones(3)) -> torch.Tensor:  # noqa: B008 (the case under test)
        return x + bias


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_tensor_default_argument_is_used_and_cannot_be_overridden(backend):
    p = torchdefer.script(TensorDefault(), X, backend=backend)
    x = torch.randn(2, 3)
    torch.testing.assert_close(p(x), TensorDefault()(x))
    with pytest.raises(TypeError, match=r"does not accept \['bias'\]: their defaults are not plain values"):
        p(x, torch.zeros(3))


class Unannotated(torch.nn.Module):
    def forward(self, x, n):
        return x * n


class Annotated(torch.nn.Module):
    def forward(self, x, n: int):
        return x * n


class Contradicting(torch.nn.Module):
    def forward(self, x, n: str):
        return x


def test_int_descriptor_types_an_unannotated_parameter_as_the_annotation_would():
    p = torchdefer.script(Unannotated(), {**X, "n": int}, backend="jit")
    annotated = torch.jit.script(Annotated())
    assert [str(i.type()) for i in list(annotated.forward.graph.inputs())[2:]] == ["int"]
    assert "%n.1 : int" in p.graph
    x = torch.randn(2, 3)
    for n in (0, 1, 4):
        torch.testing.assert_close(p(x, n), Unannotated()(x, n))
        torch.testing.assert_close(p(x, n), annotated(x, n))
    with pytest.raises(DescriptorMismatch, match=r"n \(type\): expected int, got float 2.5"):
        p(x, 2.5)


def test_descriptor_contradicting_an_annotation_is_refused_at_script_time():
    with pytest.raises(TypeError, match=r"types Contradicting.forward\(\) parameter 'n' as str \(from its annotation.*but it is described as int; annotate"):
        torchdefer.script(Contradicting(), {**X, "n": int}, backend="jit")


class Unscriptable(torch.nn.Module):
    def forward(self, x):
        return (lambda t: t.tanh())(x)


def test_model_torchscript_cannot_compile_is_refused_with_advice_and_runs_on_export():
    with pytest.raises(TypeError, match=r"torch.jit.script cannot compile Unscriptable.forward: .*use backend='export' \(the default\)"):
        torchdefer.script(Unscriptable(), X, backend="jit")
    p = torchdefer.script(Unscriptable(), X)
    x = torch.randn(4, 3)
    torch.testing.assert_close(p(x), x.tanh())


def test_jit_graph_inputs_carry_refined_types():
    p = torchdefer.script(Linear(), {"x": MetaTensorType(["b", 3], F32)}, backend="jit")
    assert "Float(*, 3" in p.graph


# --- descriptors take precedence over missing annotations (the RFC) ---------
class RfcModel(torch.nn.Module):
    """The RFC's own example: ``flag`` is unannotated."""

    def forward(self, x, flag):
        if flag:
            return torch.add(x, 1)
        return torch.sub(x, 1)


def test_the_rfc_flag_example_scripts_with_the_branch_gone():
    meta = MetaTensorType([100, 200], torch.float64)
    p = torchdefer.script(RfcModel(), {"x": meta, "flag": True}, backend="jit")
    assert "aten::add" in p.graph and "aten::sub" not in p.graph
    x = torch.randn(100, 200, dtype=torch.float64)
    torch.testing.assert_close(p(x, True), RfcModel()(x, True))
    with pytest.raises(DescriptorMismatch, match=r"flag \(value\): expected True, got False"):
        p(x, False)
    with pytest.raises(DescriptorMismatch, match=r"x.shape\[0\]: expected 100, got 3"):
        p(torch.ones(3, 200, dtype=torch.float64), True)


def pairs(x, pair, n, ids, mask, parts):
    a, b = pair
    for _ in range(n):
        x = x + a * b
    x = x + float(sum(ids))
    if mask is not None:
        x = x * mask
    return x + parts["u"] - parts["v"]


def pairs_annotated(x, pair: tuple[torch.Tensor, torch.Tensor], n: int, ids: list[int],
                    mask: torch.Tensor | None, parts: dict[str, torch.Tensor]):
    a, b = pair
    for _ in range(n):
        x = x + a * b
    x = x + float(sum(ids))
    if mask is not None:
        x = x * mask
    return x + parts["u"] - parts["v"]


V = MetaTensorType(["b"], F32)
PAIRS = {"x": V, "pair": (V, V), "n": int, "ids": list[int], "mask": MetaTensorType | None,
         "parts": {"u": V, "v": V}}


def test_unannotated_parameters_take_their_types_from_the_descriptors():
    p = torchdefer.script(pairs, PAIRS, backend="jit")
    twin = torch.jit.script(pairs_annotated)
    inputs = [line.strip(" ,):") for line in str(twin.graph).splitlines()[1:6]]
    assert inputs == ["%pair.1 : (Tensor, Tensor", "%n.1 : int", "%ids.1 : int[]",
                      "%mask.1 : Tensor?", "%parts.1 : Dict(str, Tensor"]
    for line in inputs[1:]:
        assert line in p.graph
    assert "%pair.1 : (Float(*), Float(*))" in p.graph  # refined as a top-level x is
    x, a, b = torch.randn(3), torch.randn(3), torch.randn(3)
    parts = {"u": torch.randn(3), "v": torch.randn(3)}
    for n, ids, mask in [(0, [], None), (2, [1, 2], torch.randn(3)), (1, [5], None)]:
        want = pairs(x, (a, b), n, ids, mask, parts)
        torch.testing.assert_close(p(x, (a, b), n, ids, mask, parts), want)
        torch.testing.assert_close(twin(x, (a, b), n, ids, mask, parts), want)
    with pytest.raises(DescriptorMismatch, match=r"pair \(structure\)"):
        p(x, [a, b], 1, [], None, parts)


def with_defaults(x, flag=True, n: int = 2, scale=0.5):
    return (x * n * scale) if flag else x - n


def test_undescribed_parameters_stay_generic_instead_of_pinned_to_their_defaults():
    p = torchdefer.script(with_defaults, {"x": V}, backend="jit")
    for name, kind in [("flag", "bool"), ("n", "int"), ("scale", "float")]:
        assert f"%{name}.1 : {kind}" in p.graph
    x = torch.randn(4)
    for args in [(), (False,), (True, 5), (True, 3, 2.0), (False, 7, 1.5)]:
        torch.testing.assert_close(p(x, *args), with_defaults(x, *args))
    torch.testing.assert_close(p(x, scale=3.0), with_defaults(x, scale=3.0))
    with pytest.raises(DescriptorMismatch, match=r"flag \(type\): expected bool, got int 1"):
        p(x, 1)
    assert p.input_descriptors == {"x": V}


def test_generic_jit_program_survives_save_and_load(tmp_path):
    p = torchdefer.script(with_defaults, {"x": V}, backend="jit")
    torchdefer.save_program(p, tmp_path / "p.tdp")
    q = torchdefer.load_program(tmp_path / "p.tdp", allow_torchscript=True)
    x = torch.randn(4)
    for args in [(), (False, 3), (True, 3, 2.0)]:
        torch.testing.assert_close(q(x, *args), with_defaults(x, *args))
    with pytest.raises(DescriptorMismatch, match=r"n \(type\): expected int"):
        q(x, True, "3")


def test_scripting_one_class_with_other_descriptors_keeps_each_graph_its_own():
    ints = torchdefer.script(Unannotated(), {**X, "n": int}, backend="jit")
    floats = torchdefer.script(Unannotated(), {**X, "n": float}, backend="jit")
    assert "%n.1 : int" in ints.graph and "%n.1 : float" in floats.graph
    plain = torch.jit.script(Unannotated())  # the class's own graph is untouched
    assert [str(i.type()) for i in plain.forward.graph.inputs()][2] == "Tensor"
    x = torch.randn(2, 3)
    torch.testing.assert_close(ints(x, 3), x * 3)
    torch.testing.assert_close(floats(x, 0.5), x * 0.5)


def repeat(x, n: int = 2):
    return x.repeat(n)


def test_jit_output_descriptors_hold_for_every_value_of_a_generic_parameter():
    p = torchdefer.script(repeat, {"x": V}, backend="jit")
    x = torch.randn(3)
    assert p(x, 3).shape == (9,)
    d = p.output_descriptors
    assert d.shape == ("b*n",), d  # not 2*b: n is any int


def masked(x, mask):
    return x if mask is None else x * mask


def test_none_described_for_an_unannotated_parameter_folds_its_branch():
    p = torchdefer.script(masked, {"x": V, "mask": None}, backend="jit")
    assert "aten::mul" not in p.graph
    x = torch.randn(3)
    torch.testing.assert_close(p(x, None), masked(x, None))
    with pytest.raises(DescriptorMismatch, match=r"mask \(value\): expected None"):
        p(x, x)


def to_device(x, device):
    return x.to(device)


def test_a_device_value_types_an_unannotated_parameter_as_device():
    p = torchdefer.script(to_device, {"x": V, "device": torch.device("cpu")}, backend="jit")
    x = torch.randn(3)
    torch.testing.assert_close(p(x, torch.device("cpu")), to_device(x, torch.device("cpu")))
    with pytest.raises(DescriptorMismatch, match=r"device \(value\): expected device"):
        p(x, torch.device("meta"))


class Stacked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x, n, flag=True):
        for _ in range(n):
            x = self.drop(self.lin(x))
        return x if flag else -x


def test_a_module_typed_from_descriptors_keeps_its_submodules_weights_and_mode():
    model = Stacked().eval()
    p = torchdefer.script(model, {**X, "n": int}, backend="jit")
    x = torch.randn(2, 3)
    for n, flag in [(0, True), (2, False), (3, True)]:
        torch.testing.assert_close(p(x, n, flag), model(x, n, flag))
    model.lin.weight = torch.nn.Parameter(torch.randn(3, 3))  # reassigned after script()
    torch.testing.assert_close(p(x, 2), model(x, 2))
    model.train()
    torch.manual_seed(0)
    got = p(x, 1)
    torch.manual_seed(0)
    torch.testing.assert_close(got, model(x, 1))


def mask_default(x, mask=None, scale: float = 0.5, weight: torch.Tensor | None = None):
    x = x if mask is None else x * mask
    return x * scale if weight is None else x * weight


def test_undescribed_none_defaults_stay_generic_as_optional_tensors():
    p = torchdefer.script(mask_default, {"x": V}, backend="jit")
    assert "%mask.1 : Tensor?" in p.graph and "%weight.1 : Tensor?" in p.graph
    x, m, w = torch.randn(3), torch.randn(3), torch.randn(3)
    for args, kwargs in [((), {}), ((None, 3.0), {}), ((m,), {}), ((m, 2.0), {"weight": w})]:
        torch.testing.assert_close(p(x, *args, **kwargs), mask_default(x, *args, **kwargs))
    with pytest.raises(DescriptorMismatch, match=r"mask \(type\): expected a Tensor, got int 1"):
        p(x, 1)


def test_tensor_only_descriptors_script_as_torch_jit_script_does(monkeypatch):
    calls = []
    real = torch.jit.script
    monkeypatch.setattr(torch.jit, "script", lambda obj, *a, **k: calls.append(obj) or real(obj))
    model = Linear()
    torchdefer.script(model, X, backend="jit")
    assert calls == [model]  # no annotation to add: torch.jit.script itself, types shared


def full(x, s: float = 0.5):
    return x, torch.full((2,), s)


@pytest.mark.parametrize("descriptors", [{"x": V, "s": float}, {"x": V}],
                         ids=["described", "undescribed"])
def test_an_int_for_a_float_parameter_is_refused_where_torchscript_would_change_its_dtype(
        descriptors):
    script = torch.jit.script(full)
    x = torch.ones(2)
    assert script(x, 3)[1].dtype != full(x, 3)[1].dtype  # what the refusal prevents
    p = torchdefer.script(full, descriptors, backend="jit")
    with pytest.raises(DescriptorMismatch, match=r"s \(type\): expected float, got int 3; "
                                                 r"TorchScript would run it as a float.*pass 3.0"):
        p(x, 3)
    torch.testing.assert_close(p(x, 3.0), full(x, 3.0))


def test_export_runs_an_int_for_a_float_parameter_as_eager_does():
    q = torchdefer.script(full, {"x": V, "s": float})
    x = torch.ones(2)
    torch.testing.assert_close(q(x, 3), full(x, 3))
    assert q(x, 3)[1].dtype == torch.int64
