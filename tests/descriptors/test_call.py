"""A call that does not fit the signature is refused with Python's own words:
every message is compared with what the eager call raises."""

import inspect

import pytest
import torch

import torchdefer
from torchdefer.descriptors import MetaTensorType
from torchdefer.descriptors._call import call_error

T = torch.zeros(2)
X = MetaTensorType(["b"], torch.float32)


def one(x):
    return x


def mixed(x, n: int = 1, /, s: float = 2.0, *, k: int, flag: bool = True):
    return x * n * s * k if flag else x


def two_keyword_only(x, *, k: int, m: int):
    return x * k * m


def three(x, y, z):
    return x + y + z


def with_tensor_default(x, bias=T):
    return x + bias


class Forward(torch.nn.Module):
    def forward(self, x, flag=True):
        return x + 1 if flag else x


class ForwardOne(torch.nn.Module):
    def forward(self, x):
        return x * 2


CASES = [
    (one, {"x": X}, [((T, T), {}), ((T, T, T), {}), ((), {}), ((T,), {"y": T}),
                     ((T,), {"x": T}), ((), {"y": T})]),
    (mixed, {"x": X, "n": int, "s": float, "k": int},
     [((T,), {}), ((T, 1, 2.0, 3), {}), ((T, 1, 2.0, 3), {"k": 1}),
      ((T, 1, 2.0, 3, 4), {"k": 1, "flag": True}), ((T,), {"x": T, "k": 1}),
      ((T,), {"x": T, "n": 1, "k": 1}), ((T,), {"s": 1.0, "k": 1, "z": 1}),
      ((T, 1, 2.0), {"s": 1.0, "k": 1}), ((), {"k": 1}), ((), {})]),
    (two_keyword_only, {"x": X, "k": int, "m": int},
     [((T,), {}), ((T,), {"k": 1}), ((T, 1), {}), ((T, 1), {"m": 1})]),
    (three, {"x": X, "y": X, "z": X}, [((), {}), ((T,), {}), ((T,), {"z": T}),
                                       ((T, T, T, T), {})]),
    (with_tensor_default, {"x": MetaTensorType([2], torch.float32)}, [((T, T, T), {}), ((), {}), ((T,), {"b": T})]),
]


def _message(call, args, kwargs):
    with pytest.raises(TypeError) as e:
        call(*args, **kwargs)
    return str(e.value)


# TorchScript compiles no keyword-only parameter with a default (mixed's flag).
BACKENDS = [(backend, case) for case in CASES for backend in ("export", "jit")
            if not (backend == "jit" and case[0] is mixed)]


@pytest.mark.parametrize(("backend", "case"), BACKENDS,
                         ids=[f"{b}-{case[0].__name__}" for b, case in BACKENDS])
def test_a_call_that_does_not_fit_is_refused_with_the_message_eager_gives(backend, case):
    fn, descriptors, calls = case
    p = torchdefer.script(fn, descriptors, backend=backend)
    for args, kwargs in calls:
        assert _message(p, args, kwargs) == _message(fn, args, kwargs), (args, kwargs)


def test_jit_refuses_a_keyword_only_parameter_with_a_default_at_script_time():
    with pytest.raises(TypeError, match=r"torch.jit.script cannot compile mixed.*keyword-only"):
        torchdefer.script(mixed, CASES[1][1], backend="jit")


@pytest.mark.parametrize("backend", ["export", "jit"])
@pytest.mark.parametrize(("cls", "calls"), [
    (Forward, [((T, True, 1), {}), ((T, True, 1, 2), {}), ((), {}), ((T,), {"y": 1}),
               ((T,), {"x": T})]),
    (ForwardOne, [((T, True), {}), ((T, True, 1), {}), ((), {}), ((T,), {"flag": True})]),
], ids=["Forward", "ForwardOne"])
def test_a_module_program_counts_self_as_calling_the_module_does(cls, calls, backend):
    model = cls()
    p = torchdefer.script(model, {"x": X}, backend=backend)
    for args, kwargs in calls:
        assert _message(p, args, kwargs) == _message(model, args, kwargs), (args, kwargs)


def test_a_loaded_program_words_its_refusals_as_the_scripted_one(tmp_path):
    model = Forward()
    p = torchdefer.script(model, {"x": X})
    torchdefer.save_program(p, tmp_path / "p.tdp")
    q = torchdefer.load_program(tmp_path / "p.tdp")
    for args in [(T, True, 1), ()]:
        assert _message(q, args, {}) == _message(model, args, {})


def test_call_error_says_nothing_of_a_call_that_fits():
    signature = inspect.signature(mixed)
    assert call_error("mixed", signature, (T, 1, 2.0), {"k": 1}) is None
    assert call_error("mixed", signature, (T,), {"s": 2.0, "k": 1, "flag": False}) is None


def test_describe_words_an_example_call_that_does_not_fit_as_python_does():
    for args in [(T, T), ()]:
        with pytest.raises(TypeError) as e:
            torchdefer.describe(one, args)
        assert str(e.value).endswith(_message(one, args, {}))
    with pytest.raises(TypeError, match=r"Forward.forward\(\) takes from 2 to 3 positional "
                                        r"arguments but 4 were given$"):
        torchdefer.describe(Forward(), (T, True, 1))


def with_rest(x, *rest, **options):
    return x


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_extra_arguments_for_a_variadic_callable_say_the_program_takes_none(backend, tmp_path):
    if backend == "jit":
        with pytest.raises(TypeError, match=r"torch.jit.script cannot compile"):
            torchdefer.script(with_rest, {"x": X}, backend=backend)
        return
    p = torchdefer.script(with_rest, {"x": X})
    torchdefer.save_program(p, tmp_path / "p.tdp")
    for program in (p, torchdefer.load_program(tmp_path / "p.tdp")):
        with pytest.raises(TypeError, match=r"with_rest\(\) takes 1 positional argument but 2 were "
                                            r"given \(the program takes no \*args or \*\*kwargs"):
            program(T, T)
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'k' \(the program"):
            program(T, k=1)
        with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'x'$"):
            program()
