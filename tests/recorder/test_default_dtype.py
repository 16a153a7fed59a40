"""Ops whose result dtype is the default dtype at call time replay under that default.

Integer inputs promoted to a float (``log(arange(4))``, ``arange(4) * 0.5``,
int / int) take ``torch.get_default_dtype()`` when they run; Hugging Face's
``from_config(..., dtype=torch.bfloat16)`` sets it while building and restores it.
"""

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_tensor, build_both

PROMOTING = {
    "log_arange": lambda: torch.log(torch.arange(1, 5)),
    "exp_arange_times_float": lambda: torch.exp(torch.arange(8) * -0.6),
    "int_div_int": lambda: torch.arange(4) / torch.arange(1, 5),
    "int_div_python_int": lambda: torch.tensor([1, 2]) / 3,
    "sqrt_int": lambda: torch.sqrt(torch.arange(4)),
    "pow_int_float": lambda: torch.pow(torch.arange(4), 0.5),
    "python_float_pow_int": lambda: 2.0 ** torch.arange(4),
    "int_times_python_float": lambda: torch.arange(4) * 0.5,
    "int_plus_python_float": lambda: torch.arange(4) + 0.25,
    "int_times_complex": lambda: torch.view_as_real(torch.arange(3) * 1j),
    "where_int_float": lambda: torch.where(torch.arange(4) > 1, torch.arange(4), 0.5),
    "sigmoid_rsqrt_erf": lambda: torch.sigmoid(torch.arange(4)) + torch.erf(torch.arange(4)),
    "atan2_int": lambda: torch.atan2(torch.arange(4), torch.arange(1, 5)),
    "bool_mean_after_float": lambda: (torch.arange(6) > 2) * 1.5,
    "full_float_fill": lambda: torch.full((2,), 1.5),
    # eager infers complex64 under a float16 default, the meta kernel complex32
    "full_complex_fill": lambda: torch.view_as_real(torch.full((2,), 1 + 2j)),
    "full_bool_fill": lambda: torch.full((2,), True),
    "full_int_fill_then_div": lambda: torch.full((2,), 3) / 2,
    "linspace": lambda: torch.linspace(0, 1, 5),
    "arange_float": lambda: torch.arange(0.0, 2.0, 0.5),
    "tensor_of_floats": lambda: torch.tensor([1.5, 2.5]) * torch.arange(2),
    "rotary_inv_freq": lambda: 1.0 / (10000 ** (torch.arange(0, 8, 2) / 8)),
    "randint_divided": lambda: torch.randint(0, 10, (5,)) / 7,
    "linear_layer": lambda: nn.Linear(3, 2).weight * torch.arange(2).unsqueeze(1),
}


def built_under(dtype, fn):
    def build():
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            return fn()
        finally:
            torch.set_default_dtype(previous)

    return build


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(PROMOTING))
def test_default_dtype_while_building_decides_the_replayed_dtype(name, dtype):
    eager, deferred = build_both(built_under(dtype, PROMOTING[name]))
    assert deferred.dtype == eager.dtype
    assert_same_tensor(torchdefer.materialize_tensor(deferred), eager)


def test_bfloat16_times_complex_is_recorded_as_eager_promotes_it():
    # An integer tensor times a complex scalar under a bfloat16 default is
    # complex64 in eager (torch 2.15's meta kernels said bcomplex32); a
    # bfloat16 tensor times one is what eager's promotion says (bcomplex32 on
    # 2.15, whose CPU kernels then refuse it).
    eager, deferred = build_both(built_under(torch.bfloat16, lambda: torch.arange(2) * 1j))
    assert deferred.dtype == eager.dtype
    bf16 = torch.ones(2, dtype=torch.bfloat16)
    with torchdefer.fake_mode():
        fake = torch.ones(2, dtype=torch.bfloat16) * 1j
    assert fake.dtype == torch.result_type(bf16, 1j)


def test_materializing_under_another_default_dtype_still_gives_the_recorded_one():
    eager, deferred = build_both(lambda: torch.log(torch.arange(1, 5)))
    torch.set_default_dtype(torch.float64)
    try:
        real = torchdefer.materialize_tensor(deferred)
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)
    assert_same_tensor(real, eager)


def test_hugging_face_style_dtype_switch_around_a_module_matches_eager():
    class Rotary(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)
            inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.int64).float() / 8))
            t = torch.arange(16)
            self.register_buffer("freqs", torch.outer(t, inv))
            self.register_buffer("scale", torch.arange(1, 9) ** -0.5)

    eager, deferred = build_both(built_under(torch.bfloat16, Rotary))
    torchdefer.materialize_module(deferred)
    for name, ref in [*eager.named_parameters(), *eager.named_buffers()]:
        assert_same_tensor(deferred.get_parameter(name) if "proj" in name else deferred.get_buffer(name), ref, name)


def test_deterministic_mode_while_building_fills_empty_tensors_as_eager_did():
    def build():
        torch.use_deterministic_algorithms(True)
        try:
            return torch.empty(4), torch.empty(3, dtype=torch.int64)
        finally:
            torch.use_deterministic_algorithms(False)

    eager, deferred = build_both(build)
    for ref, t in zip(eager, deferred, strict=True):
        real = torchdefer.materialize_tensor(t)
        assert real.dtype == ref.dtype
        assert torch.equal(real.isnan(), ref.isnan()) and torch.equal(real.nan_to_num(), ref.nan_to_num())
    assert not torch.are_deterministic_algorithms_enabled()


def test_replay_leaves_the_callers_settings_as_found_even_when_it_fails():
    external = torch.ones(2, dtype=torch.float64)

    def build():
        torch.set_default_dtype(torch.float64)
        torch.set_float32_matmul_precision("high")
        try:
            x = torch.arange(2) * 0.5
            return x, x + external
        finally:
            torch.set_default_dtype(torch.float32)
            torch.set_float32_matmul_precision("highest")

    x, y = torchdefer.deferred_init(build)
    assert torchdefer.materialize_tensor(x).dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32
    assert torch.get_float32_matmul_precision() == "highest"
    external.add_(1)
    with pytest.raises(torchdefer.materialize.ExternalTensorModifiedError):
        torchdefer.materialize_tensor(y)
    assert torch.get_default_dtype() == torch.float32
    assert torch.get_float32_matmul_precision() == "highest"
