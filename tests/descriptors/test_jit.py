"""backend="jit": right answers, or refusals at script() time that say what to do."""

import functools

import pytest
import torch

import torchdefer
from torchdefer.descriptors import MetaTensorType

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


def test_int_descriptor_on_an_unannotated_parameter_is_refused_at_script_time():
    with pytest.raises(TypeError, match=r"types Unannotated.forward\(\) parameter 'n' as Tensor \(unannotated parameters are Tensor\), but it is described as int; annotate"):
        torchdefer.script(Unannotated(), {**X, "n": int}, backend="jit")
    p = torchdefer.script(Annotated(), {**X, "n": int}, backend="jit")
    x = torch.randn(2, 3)
    torch.testing.assert_close(p(x, 4), Annotated()(x, 4))
    q = torchdefer.script(Unannotated(), {**X, "n": int})  # export takes what Python takes
    torch.testing.assert_close(q(x, 4), Unannotated()(x, 4))


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
