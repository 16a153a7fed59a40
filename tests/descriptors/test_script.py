"""script(): specialization on both backends, compared against eager."""

import dataclasses
import sys
from typing import List, Optional  # noqa: UP035 (typing objects are descriptors, per the RFC)

import pytest
import torch

import torchdefer
from torchdefer.descriptors import DescriptorConflict, DescriptorMismatch, MetaTensorType

F32 = torch.float32


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(10, 3)

    def forward(self, x: torch.Tensor, flag: bool, n: int) -> torch.Tensor:
        if flag:
            return torch.sigmoid(self.lin(x)) * n
        return torch.tanh(self.lin(x)) - n


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_value_specialized_branch_is_gone_from_the_graph(backend):
    model = Branchy()
    p = torchdefer.script(
        model, {"x": MetaTensorType(["b", 10], F32), "flag": True, "n": int}, backend=backend
    )
    assert "sigmoid" in p.graph
    assert "tanh" not in p.graph
    x = torch.randn(5, 10)
    torch.testing.assert_close(p(x, True, 3), model(x, True, 3))
    with pytest.raises(DescriptorMismatch, match=r"flag \(value\): expected True, got False"):
        p(x, False, 3)


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_symbolic_dim_runs_for_every_length_including_zero_and_one(backend):
    model = Branchy()
    p = torchdefer.script(
        model, {"x": MetaTensorType(["b", 10], F32), "flag": False, "n": 2}, backend=backend
    )
    for b in [0, 1, 2, 3, 17]:
        x = torch.randn(b, 10)
        torch.testing.assert_close(p(x, False, 2), model(x, False, 2))


def test_export_graph_keeps_the_symbol_dynamic_and_names_it():
    p = torchdefer.script(Branchy(), {"x": MetaTensorType(["b", 10], F32), "flag": True, "n": 1})
    first_line = p.graph.splitlines()[0]
    assert first_line.endswith("= b")
    symbol = first_line.split()[1]
    assert f"f32[{symbol}, 3]" in p.graph


def test_output_descriptors_mirror_nested_outputs_with_symbols_propagated():
    def f(x, y):
        return {"sum": x + 1, "parts": (x[:, :2], torch.cat([x, y], 0))}, x.shape[0]

    d = {
        "x": MetaTensorType(["b", 10], F32, dim_ranges={"b": (1, 8)}),
        "y": MetaTensorType(["c", 10], F32),
    }
    p = torchdefer.script(f, d)
    outs, size = p.output_descriptors
    assert outs["sum"].shape == ("b", 10)
    assert outs["sum"].ranges == {"b": (1, 8)}
    assert outs["parts"][0].shape == ("b", 2)
    assert outs["parts"][1].shape == ("b + c", 10)
    x, y = torch.randn(3, 10), torch.randn(4, 10)
    got, ref = p(x, y), f(x, y)
    torch.testing.assert_close(got, ref)
    assert got[0]["parts"][1].shape == ref[0]["parts"][1].shape


def test_jit_output_descriptors_use_the_descriptor_names():
    p = torchdefer.script(
        Branchy(), {"x": MetaTensorType(["b", 10], F32), "flag": True, "n": 1}, backend="jit"
    )
    assert p.output_descriptors.shape == ("b", 3)


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_rank_only_descriptor_admits_any_lengths_of_that_rank(backend):
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sum(-1) * 2

    p = torchdefer.script(f, {"x": MetaTensorType(rank=3, dtype=F32)}, backend=backend)
    for shape in [(1, 2, 3), (4, 0, 5), (2, 2, 2)]:
        x = torch.randn(shape)
        torch.testing.assert_close(p(x), f(x))
    with pytest.raises(DescriptorMismatch, match=r"x\.ndim: expected 3, got 2"):
        p(torch.randn(2, 2))


def scaled_sum(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sum(0)


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_shape_only_descriptor_runs_float32_and_float64_with_one_graph_per_dtype(backend):
    p = torchdefer.script(scaled_sum, {"x": MetaTensorType(["b", 4])}, backend=backend)
    for dtype in [torch.float32, torch.float64, torch.float32]:
        for b in [3, 5]:
            x = torch.randn(b, 4, dtype=dtype)
            got = p(x)
            assert got.dtype == dtype
            torch.testing.assert_close(got, scaled_sum(x))
    assert p.variants == (2 if backend == "export" else 1)
    with pytest.raises(DescriptorMismatch, match=r"x\.shape\[1\]: expected 4, got 5"):
        p(torch.randn(2, 5))


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_rank_and_dtype_unknown_descriptor_builds_per_rank_and_dtype(backend):
    p = torchdefer.script(scaled_sum, {"x": MetaTensorType()}, backend=backend)
    assert p.output_descriptors is None or backend == "jit"
    for x in [torch.randn(3), torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64)]:
        torch.testing.assert_close(p(x), scaled_sum(x))
    if backend == "export":
        assert p.variants == 3
        assert p.output_descriptors.dtype == F32  # of the first graph built


def sum_lengths(x: torch.Tensor, lengths: List[int], scale: Optional[torch.Tensor]) -> torch.Tensor:  # noqa: UP006, UP045 (TorchScript reads these)
    out = x * len(lengths)
    for n in lengths:
        out = out + n
    if scale is not None:
        out = out * scale
    return out


@pytest.mark.parametrize("backend", ["export", "jit"])
@pytest.mark.parametrize("lengths", [List[int], list[int]])  # noqa: UP006 (typing objects as the RFC lists them)
def test_typing_objects_describe_lists_and_optionals(backend, lengths):
    p = torchdefer.script(
        sum_lengths,
        {"x": MetaTensorType(["b"], F32), "lengths": lengths, "scale": Optional[MetaTensorType]},  # noqa: UP045
        backend=backend,
    )
    x = torch.randn(4)
    for ns, scale in [([1, 2], None), ([3], torch.randn(4)), ([], None), ([5, 6, 7], torch.ones(1))]:
        torch.testing.assert_close(p(x, ns, scale), sum_lengths(x, ns, scale))
    with pytest.raises(DescriptorMismatch, match=r"lengths\[1\] \(type\): expected int, got float"):
        p(x, [1, 2.5], None)
    with pytest.raises(DescriptorMismatch, match=r"lengths \(type\): expected a list, got a tuple"):
        p(x, (1, 2), None)


def total(xs: List[torch.Tensor]) -> torch.Tensor:  # noqa: UP006 (TorchScript reads it)
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_list_of_metatensortype_checks_each_element_and_shares_symbols(backend):
    p = torchdefer.script(total, {"xs": list[MetaTensorType(["n"], F32)]}, backend=backend)
    xs = [torch.randn(3) for _ in range(4)]
    torch.testing.assert_close(p(xs), total(xs))
    torch.testing.assert_close(p(xs[:2]), total(xs[:2]))
    with pytest.raises(DescriptorMismatch, match=r"xs\[2\]\.shape\[0\]: expected 'n' = 3, got 5; 'n' is 3 from xs\[0\]\.shape\[0\]"):
        p([*xs[:2], torch.randn(5)])
    q = torchdefer.script(total, {"xs": List[MetaTensorType]}, backend=backend)  # noqa: UP006
    torch.testing.assert_close(q(xs[:3]), total(xs[:3]))


def test_typing_object_that_is_not_a_descriptor_is_refused_with_the_supported_forms():
    with pytest.raises(TypeError, match=r"input descriptor for xs is typing.Dict\[str, int\]; expected"):
        torchdefer.script(total, {"xs": __import__("typing").Dict[str, int]})


class NeedsFour(torch.nn.Module):
    def forward(self, x):
        return x.view(4, -1)


def test_descriptor_contradicted_by_the_code_is_reported_at_script_time_with_the_line():
    with pytest.raises(DescriptorConflict) as e:
        torchdefer.script(NeedsFour(), {"x": MetaTensorType(["b", 10], F32)})
    message = str(e.value)
    assert "'b' is described as symbolic, but the code requires" in message
    assert "test_script.py" in message
    assert "return x.view(4, -1)" in message
    assert "s7" not in message.split("\n")[2]  # guards are written in the descriptors' names
    assert e.value.dims == ("b",)


@pytest.mark.parametrize("code", ["return x.view(4, -1)", "raise ValueError('boom')"])
def test_model_code_from_exec_or_a_notebook_cell_is_the_line_named(code):
    # Code compiled from a string ("<string>", "<stdin>", a notebook cell) is
    # the user's, not generated library code: the message points at it.
    namespace = {}
    exec(compile(f"def forward(x):\n    y = x + 1\n    {code}\n", "<user-cell>", "exec"), namespace)
    with pytest.raises(DescriptorConflict, match=r"at <user-cell>:3 in forward") as e:
        torchdefer.script(namespace["forward"], {"x": MetaTensorType(["b", 10], F32)})
    assert "torchdefer" not in str(e.value).replace("torchdefer.script", "")


@dataclasses.dataclass
class Box:
    t: torch.Tensor


def compares_boxes(x):
    y = x + 1
    return y if Box(y) == Box(x) else x


def test_failure_inside_a_dataclass_generated_method_names_the_users_line():
    # Code objects know their qualified name (``__create_fn__.<locals>.__eq__``)
    # from Python 3.11; on 3.10 the generated method's own frame is named.
    where = (r"test_script.py:\d+ in compares_boxes: return y if Box" if sys.version_info >= (3, 11)
             else r"<string>:\d+ in __eq__")
    with pytest.raises(DescriptorConflict, match=where):
        torchdefer.script(compares_boxes, {"x": MetaTensorType(["b", 10], F32)})


def test_static_descriptor_that_satisfies_the_code_scripts_fine():
    p = torchdefer.script(NeedsFour(), {"x": MetaTensorType([4, 10], F32)})
    x = torch.randn(4, 10)
    torch.testing.assert_close(p(x), x.view(4, -1))


def test_descriptor_of_a_tensor_value_is_rejected_with_a_hint():
    with pytest.raises(TypeError, match=r"MetaTensorType.from_examples\(t\)"):
        torchdefer.script(NeedsFour(), {"x": torch.zeros(4, 10)})


def test_program_runs_with_the_modules_current_weights():
    model = Branchy()
    p = torchdefer.script(model, {"x": MetaTensorType(["b", 10], F32), "flag": True, "n": 1})
    with torch.no_grad():
        model.lin.weight.mul_(3)
    x = torch.randn(2, 10)
    torch.testing.assert_close(p(x, True, 1), model(x, True, 1))
    model.lin.weight = torch.nn.Parameter(torch.randn(3, 10))
    torch.testing.assert_close(p(x, True, 1), model(x, True, 1))


def test_program_refuses_weights_whose_dtype_changed_after_script():
    model = Branchy()
    p = torchdefer.script(model, {"x": MetaTensorType(["b", 10], F32), "flag": True, "n": 1})
    model.double()
    with pytest.raises(RuntimeError, match=r"weight 'lin.weight' is now torch.float64 \[3, 10\], but the program was built for torch.float32"):
        p(torch.randn(2, 10), True, 1)


@dataclasses.dataclass
class Registered:
    value: torch.Tensor
    scale: torch.Tensor


torch.utils._pytree.register_dataclass(Registered, serialized_type_name="test_script.Registered")


class Unregistered:
    def __init__(self, value, label):
        self.value, self.label = value, label


def returns_registered(x):
    return {"out": Registered(x * 2, x.sum()), "n": 3}


def returns_unregistered(x):
    return [Unregistered(x + 1, "plus one"), x]


def test_outputs_of_pytree_registered_classes_are_rebuilt_and_saved(tmp_path):
    p = torchdefer.script(returns_registered, {"x": MetaTensorType(["b"], F32)})
    x = torch.randn(5)
    got = p(x)
    assert type(got["out"]) is Registered and got["n"] == 3
    torch.testing.assert_close(got["out"].value, x * 2)
    assert p.output_descriptors["out"].value.shape == ("b",)
    torchdefer.save_program(p, tmp_path / "p.tdp")
    again = torchdefer.load_program(tmp_path / "p.tdp")(x)
    assert type(again["out"]) is Registered
    torch.testing.assert_close(again["out"].scale, x.sum())


def test_outputs_of_unregistered_classes_are_rebuilt_in_process_and_refused_by_save(tmp_path):
    p = torchdefer.script(returns_unregistered, {"x": MetaTensorType(["b"], F32)})
    x = torch.randn(3)
    obj, same = p(x)
    assert type(obj) is Unregistered and obj.label == "plus one"
    torch.testing.assert_close((obj.value, same), (x + 1, x))
    with pytest.raises(TypeError, match=r"outputs hold a test_script.Unregistered, which torch.utils._pytree does not know"):
        torchdefer.save_program(p, tmp_path / "p.tdp")


class Dropout(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.dropout(x, 0.5, self.training)


def test_export_program_refuses_a_model_switched_to_another_mode_after_script():
    model = Dropout().eval()
    p = torchdefer.script(model, {"x": MetaTensorType(["b"], F32)})
    x = torch.ones(8)
    torch.testing.assert_close(p(x), x)
    model.train()
    with pytest.raises(RuntimeError, match=r"built with the model in eval mode.*call model.eval\(\)"):
        p(x)


def test_jit_program_follows_the_models_mode():
    model = Dropout().eval()
    p = torchdefer.script(model, {"x": MetaTensorType(["b"], F32)}, backend="jit")
    x = torch.ones(1000)
    torch.testing.assert_close(p(x), x)
    model.train()
    assert (p(x) == 0).any()
