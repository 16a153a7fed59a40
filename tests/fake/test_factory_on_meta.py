"""``fake.factory_on_meta`` (a factory's meta call through torch's Python binding) gives
``run_on_meta``'s answer: the same meta tensor layout and dtype, the same reported device."""

from __future__ import annotations

import pytest
import torch

from torchdefer.fake._tensor import factory_on_meta, run_on_meta

_aten = torch.ops.aten
_FACTORIES = [_aten.empty.memory_format, _aten.ones.default, _aten.zeros.default]
_KWARGS = [
    {},
    {"dtype": None, "device": torch.device("cpu"), "pin_memory": False},
    {"dtype": torch.float16, "device": torch.device("cuda")},
    {"dtype": torch.bfloat16, "device": torch.device("cuda", 1)},
    {"dtype": torch.int64, "device": "cuda:0"},
    {"device": torch.device("meta")},
    {"dtype": torch.complex64},
    {"dtype": torch.bool, "pin_memory": False},
]


def _same(a: tuple, b: tuple) -> None:
    (out_a, device_a), (out_b, device_b) = a, b
    assert device_a == device_b
    assert type(out_a) is type(out_b) is torch.Tensor
    assert out_a.is_meta and out_b.is_meta
    assert (out_a.shape, out_a.stride(), out_a.storage_offset(), out_a.dtype,
            out_a.requires_grad) == (out_b.shape, out_b.stride(), out_b.storage_offset(),
                                     out_b.dtype, out_b.requires_grad)


@pytest.mark.parametrize("func", _FACTORIES, ids=str)
@pytest.mark.parametrize("kwargs", _KWARGS, ids=repr)
@pytest.mark.parametrize("sizes", [[], [0], [3, 5], [2, 1, 4]], ids=repr)
def test_factory_on_meta_is_run_on_meta(func, kwargs, sizes):
    _same(factory_on_meta(func, sizes, dict(kwargs)), run_on_meta(func, (sizes,), dict(kwargs)))


@pytest.mark.parametrize("func", _FACTORIES, ids=str)
def test_default_dtype_is_read_at_the_call(func):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out, _ = factory_on_meta(func, [2], {"dtype": None})
        assert out.dtype == torch.float64
        _same((out, _), run_on_meta(func, ([2],), {"dtype": None}))
    finally:
        torch.set_default_dtype(previous)


def test_other_calls_take_run_on_meta():
    """Other keywords (layout) go the general way, with its errors."""
    kwargs = {"dtype": torch.float32, "layout": torch.strided}
    _same(factory_on_meta(_aten.empty.memory_format, [2, 3], dict(kwargs)),
          run_on_meta(_aten.empty.memory_format, ([2, 3],), dict(kwargs)))
    with pytest.raises(RuntimeError) as fast:
        factory_on_meta(_aten.zeros.default, [-1], {})
    with pytest.raises(RuntimeError) as general:
        run_on_meta(_aten.zeros.default, ([-1],), {})
    assert str(fast.value) == str(general.value)


def test_no_torch_function_mode_sees_the_meta_call():
    """A user's torch-function mode (here torch.device's) never sees torchdefer's own call."""
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Spy():
        out, device = factory_on_meta(_aten.empty.memory_format, [2], {})
    assert seen == [] and out.is_meta and device == torch.device("cpu")


_OVERLOAD_FACTORIES = [
    lambda: _aten.zeros.default([3]),
    lambda: _aten.ones.default([2, 2]),
    lambda: _aten.empty.memory_format([0]),
    lambda: _aten.full.default([2], 3.5),
    lambda: _aten.arange.default(5),
    lambda: _aten.scalar_tensor.default(2.0),
    lambda: _aten.randn.default([4]),
    lambda: _aten.rand.default([2, 3], dtype=torch.float64),
    lambda: _aten.randperm.default(6),
]


@pytest.mark.parametrize("index", range(len(_OVERLOAD_FACTORIES)))
def test_overload_factories_without_a_device_are_deferred(index):
    """``torch.ops.aten.zeros.default([n])`` (no ``device``: eager's CPU) is recorded like
    ``torch.zeros(n)``: its meta call once ran on the CPU for real (an allocation the size
    of the tensor, then a refusal), now it gives eager's values when materialized."""
    from parity import check_program

    make = _OVERLOAD_FACTORIES[index]

    def program(defer):
        return defer(lambda: [make(), torch.randn(2)])

    check_program(program)


def test_run_on_meta_never_allocates_a_factory_without_a_device():
    out, device = run_on_meta(_aten.zeros.default, ([1 << 40],), {})  # 4 TiB if it were real
    assert out.is_meta and device == torch.device("cpu")
