"""Call-time checks: every property, with the error text users read."""

import pytest
import torch

import torchdefer
from torchdefer.descriptors import DescriptorMismatch, MetaTensorType


def identity_program(descriptors, backend="export"):
    def f(x, y, inp):
        return x

    return torchdefer.script(f, descriptors, backend=backend)


def descriptors():
    return {
        "x": MetaTensorType([2, "b"], torch.float32, dim_ranges={"b": (1, 16)}),
        "y": MetaTensorType(["b"], torch.float32),
        "inp": {
            "a": True,
            "b": [MetaTensorType([3], torch.float32), MetaTensorType(["b", 3], torch.float32)],
        },
    }


def good_call(b=7):
    return (
        torch.randn(2, b),
        torch.randn(b),
        {"a": True, "b": [torch.randn(3), torch.randn(b, 3)]},
    )


def test_descriptor_mismatch_is_a_type_error_exported_from_the_top_level():
    assert torchdefer.DescriptorMismatch is DescriptorMismatch
    assert issubclass(DescriptorMismatch, TypeError)


def test_conforming_call_runs_like_eager():
    p = identity_program(descriptors())
    x, y, inp = good_call()
    assert torch.equal(p(x, y, inp), x)


def typed(x: torch.Tensor, y: torch.Tensor, inp: list[torch.Tensor]) -> torch.Tensor:
    return x + y + inp[1].sum()


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_symbolic_conflict_names_path_and_where_the_symbol_was_bound(backend):
    f32 = torch.float32
    p = torchdefer.script(
        typed,
        {
            "x": MetaTensorType([2, "b"], f32),
            "y": MetaTensorType(["b"], f32),
            "inp": [MetaTensorType([3], f32), MetaTensorType(["b", 3], f32)],
        },
        backend=backend,
    )
    x, y, inp = torch.randn(2, 7), torch.randn(7), [torch.randn(3), torch.randn(7, 3)]
    torch.testing.assert_close(p(x, y, inp), typed(x, y, inp))
    inp[1] = torch.randn(5, 3)
    with pytest.raises(DescriptorMismatch) as e:
        p(x, y, inp)
    assert str(e.value) == "inp[1].shape[0]: expected 'b' = 7, got 5; 'b' is 7 from x.shape[1]"


def test_static_dim_mismatch_message():
    p = identity_program(descriptors())
    x, y, inp = good_call()
    with pytest.raises(DescriptorMismatch, match=r"^x\.shape\[0\]: expected 2, got 4$"):
        p(torch.randn(4, 7), y, inp)


def test_range_violation_message():
    p = identity_program(descriptors())
    x, y, inp = good_call(17)
    with pytest.raises(DescriptorMismatch) as e:
        p(x, y, inp)
    assert str(e.value) == ("x.shape[1]: expected 'b' in [1, 16], got 17; 'b' is outside its range")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda c: c.__setitem__(0, c[0].double()),
            "x.dtype: expected torch.float32, got torch.float64",
        ),
        (
            lambda c: c.__setitem__(0, torch.randn(2, 7, 1)),
            "x.ndim: expected 2, got 3 (shape [2, 7, 1])",
        ),
        (
            lambda c: c[2].__setitem__("a", False),
            "inp['a'] (value): expected True, got False; the program was specialized for this "
            "value; script another program for False or describe the argument by its type",
        ),
        (
            lambda c: c[2].__setitem__("b", (c[2]["b"][0], c[2]["b"][1])),
            "inp['b'] (structure): expected a list of length 2, got a tuple of length 2",
        ),
        (
            lambda c: c[2].pop("a"),
            "inp (structure): expected a dict with keys ['a', 'b'], got keys ['b']; "
            "missing ['a'], unexpected []",
        ),
        (lambda c: c.__setitem__(1, 3.0), "y (type): expected a Tensor, got float 3.0"),
    ],
)
def test_each_property_violation_raises_with_path_property_expected_and_got(mutate, message):
    p = identity_program(descriptors())
    call = list(good_call())
    mutate(call)
    with pytest.raises(DescriptorMismatch) as e:
        p(*call)
    assert str(e.value) == message


def test_requires_grad_and_layout_are_checked():
    def f(x):
        return x * 2

    p = torchdefer.script(f, {"x": MetaTensorType([3], torch.float32, requires_grad=False)})
    with pytest.raises(DescriptorMismatch, match="x.requires_grad: expected False, got True"):
        p(torch.randn(3, requires_grad=True))
    q = torchdefer.script(f, {"x": MetaTensorType([3], layout=torch.strided)})
    with pytest.raises(DescriptorMismatch, match="x.layout: expected torch.strided, got torch.sparse_coo"):
        q(torch.randn(3).to_sparse())


def test_device_without_index_admits_every_index_of_that_type():
    d = MetaTensorType(device="meta")
    assert d.admits(torch.empty(2, device="meta"))
    assert not d.admits(torch.empty(2))
    p = torchdefer.script(lambda x: x + 1, {"x": MetaTensorType(["n"], torch.float32, device="cpu")})
    with pytest.raises(DescriptorMismatch, match="x.device: expected 'cpu', got 'meta'"):
        p(torch.empty(2, device="meta"))


def test_unknown_device_gets_one_graph_per_device():
    p = torchdefer.script(lambda x: x + 1, {"x": MetaTensorType(["n"], torch.float32)})
    assert p(torch.empty(2, device="meta")).device.type == "meta"
    torch.testing.assert_close(p(torch.ones(2)), torch.full((2,), 2.0))
    assert p.variants == 2


def test_undescribed_parameters_are_fixed_to_their_defaults():
    def f(x, scale=2.0):
        return x * scale

    p = torchdefer.script(f, {"x": MetaTensorType(["n"], torch.float32)})
    x = torch.randn(4)
    assert torch.equal(p(x), f(x))
    assert torch.equal(p(x, scale=2.0), f(x))
    with pytest.raises(DescriptorMismatch, match=r"scale \(value\): expected 2.0, got 3.0"):
        p(x, scale=3.0)


def test_type_descriptor_rejects_bool_for_int():
    def f(x, n):
        return x * n

    p = torchdefer.script(f, {"x": MetaTensorType(["n"], torch.float32), "n": int})
    x = torch.randn(3)
    assert torch.equal(p(x, 5), f(x, 5))
    with pytest.raises(DescriptorMismatch, match=r"^n \(type\): expected int, got bool True$"):
        p(x, True)


def test_positional_and_keyword_calls_bind_like_python():
    def f(x, *, scale=2.0):
        return x * scale

    p = torchdefer.script(f, {"x": MetaTensorType(["n"], torch.float32), "scale": float})
    x = torch.randn(3)
    torch.testing.assert_close(p(x=x, scale=3.0), f(x, scale=3.0))
    with pytest.raises(TypeError, match=r"f\(\) takes 1 positional argument but 2 were given$"):
        p(x, 3.0)
    with pytest.raises(TypeError, match=r"f\(\) missing 1 required positional argument: 'x'$"):
        p(scale=1.0)


def test_default_that_differs_from_the_described_value_is_refused():
    def f(x, flag=False):
        return x + 1 if flag else x

    p = torchdefer.script(f, {"x": MetaTensorType(["n"], torch.float32), "flag": True})
    with pytest.raises(DescriptorMismatch, match=r"flag \(value\): expected True, got False"):
        p(torch.randn(2))


def test_descriptor_naming_an_unknown_parameter_is_rejected_at_script_time():
    def f(x):
        return x

    with pytest.raises(TypeError, match=r"input_descriptors names \['z'\]"):
        torchdefer.script(f, {"x": MetaTensorType([1], torch.float32), "z": 1})
