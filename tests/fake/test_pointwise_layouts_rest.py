"""The elementwise overloads neither TensorIterator's rule nor ``empty_like``'s predicts.

``fake/_pointwise.py`` gives them their own rules (``CONTIGUOUS``,
``BY_DTYPE``, ``ITERATED_OPERANDS``, ``ldexp``); each test below re-derives a
rule from the installed torch, and the last sweeps every functional overload
tagged pointwise: a fake tensor's strides are eager's for all of them (issue
24: before, ``2 ** t``, ``t.masked_fill(...)``, ``torch.lerp(a, b, 0.3)``,
``isinf`` of integers and more reported the meta kernel's strides in size-1 and
size-0 dimensions).
"""

import itertools

import pytest
import torch
import torch.nn.functional as F
from test_pointwise_layouts import LAYOUTS, _aten_overloads, _named

import torchdefer
from torchdefer.fake._iterator import iterator_strides
from torchdefer.fake._layout import non_overlapping_and_dense, suggest_memory_format
from torchdefer.fake._pointwise import (
    BY_DTYPE,
    BY_DTYPE_NAMES,
    CONTIGUOUS,
    CONTIGUOUS_NAMES,
    CONTIGUOUS_ON_CPU,
    ITERATED_OPERANDS,
    ITERATED_OPERANDS_NAMES,
    dtype_kind,
)

# torch before 2.9 (2.8 checked) corrupts its heap in some backward kernels given an
# expanded grad; the sweep leaves those cases out there only.
OLD_TORCH = tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 9)

DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool, torch.complex64)


def _partners(t, all_kinds=True):
    yield torch.tensor(2.0)
    yield torch.full(t.shape, 2.0)
    if t.dim() and all_kinds:
        yield torch.full(t.shape[-1:], 2.0)


def _value(kind, dtype):
    if kind in ("Scalar", "number", "float"):
        return 0.5 if dtype.is_floating_point or dtype.is_complex else 2
    return {"int": 1, "bool": False}.get(kind)


def _calls(op, t, all_kinds=True):
    """Calls of ``op`` with ``t`` as each of its tensor arguments in turn, partners as the rest
    (``all_kinds``: a row too, broadcast)."""
    arguments = [a for a in op._schema.arguments if not a.has_default_value() and not a.kwarg_only]
    kinds = [str(a.type) for a in arguments]
    places = [i for i, k in enumerate(kinds) if k == "Tensor"]
    for main in places:
        others = [p for p in places if p != main]
        partners = list(_partners(t, all_kinds or len(others) < 2))
        for combo in itertools.product(partners, repeat=len(others)):
            args = []
            for i, kind in enumerate(kinds):
                if i == main:
                    args.append(t)
                elif kind == "Tensor":
                    args.append(combo[others.index(i)].to(t.dtype))
                else:
                    args.append(_value(kind, t.dtype))
            if None not in args:
                yield args


def _eager_outputs(op, t, all_kinds=True):
    for args in _calls(op, t, all_kinds):
        try:
            out = op(*args)
        except (RuntimeError, NotImplementedError, TypeError):
            continue  # a dtype or an argument the op refuses
        yield args, out if isinstance(out, tuple) else (out,)


def _like(t):
    size, stride = tuple(t.shape), t.stride()
    if 0 in size or non_overlapping_and_dense(size, stride):
        return stride
    return torch.empty(size, device="meta", memory_format=suggest_memory_format(size, stride)).stride()


def test_the_contiguous_table_is_what_the_installed_torch_does():
    assert len(CONTIGUOUS) == len(CONTIGUOUS_NAMES)
    for op in (*CONTIGUOUS, *CONTIGUOUS_ON_CPU):
        ran = 0
        for make, dtype in itertools.product(LAYOUTS.values(), DTYPES):
            for _, outs in _eager_outputs(op, make().to(dtype)):
                for out in outs:
                    ran += 1
                    assert out.stride() == torch.empty(out.shape).stride(), op
        assert ran, op


def test_the_by_dtype_table_is_what_the_installed_torch_does():
    assert set(map(_named, BY_DTYPE)) == set(BY_DTYPE_NAMES)
    for op, rules in BY_DTYPE.items():
        for make, dtype in itertools.product(LAYOUTS.values(), DTYPES):
            t = make().to(dtype)
            rule = rules.get(dtype_kind(dtype), "iterated")
            if rule == "like_input_if_filled":
                rule = "iterated" if t.numel() == 0 else "like_input"
            layout = (tuple(t.shape), t.stride())
            want = {"iterated": lambda: iterator_strides([layout], tuple(t.shape)),
                    "like_input": lambda: _like(t),
                    "contiguous": lambda: torch.empty(t.shape).stride()}[rule]()
            for _, outs in _eager_outputs(op, t):
                assert outs[0].stride() == want, (op, dtype, tuple(t.shape), t.stride())


def test_the_operand_table_is_what_the_installed_torch_does():
    assert set(map(_named, ITERATED_OPERANDS)) == set(ITERATED_OPERANDS_NAMES)
    for op, (indices, then_scalar) in ITERATED_OPERANDS.items():
        ran = 0
        for make, dtype in itertools.product(LAYOUTS.values(), (torch.float32, torch.int64)):
            for args, outs in _eager_outputs(op, make().to(dtype)):
                ran += 1
                size = tuple(outs[0].shape)
                layouts = [(tuple(args[i].shape), args[i].stride()) for i in indices
                           if i < len(args) and isinstance(args[i], torch.Tensor)]
                want = iterator_strides(layouts, size)
                if then_scalar:
                    want = iterator_strides([(size, want), ((), ())], size)
                assert outs[0].stride() == want, (op, [a.stride() for a in layouts])
        assert ran or op._schema.name == "aten::clamp", op  # clamp.Tensor's bounds are optional


def _in_fake_mode(op, args):
    with torchdefer.fake_mode():
        fakes = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype)
                 if isinstance(a, torch.Tensor) else a for a in args]
        out = op(*fakes)
    return out if isinstance(out, tuple) else (out,)


def _pointwise_overloads():
    for op in _aten_overloads():
        schema = op._schema
        if torch.Tag.pointwise not in op.tags or schema.is_mutable:
            continue
        if any(r.alias_info is not None for r in schema.returns):
            continue
        if schema.name != "aten::equal":  # a bool from data
            yield op


def test_every_pointwise_overload_reports_eagers_strides_on_fake_tensors():
    differ = {}
    for op in _pointwise_overloads():
        unary = sum(str(a.type) == "Tensor" for a in op._schema.arguments) == 1
        dtypes = (torch.float32, torch.int64, torch.complex64) if unary else (torch.float32,
                                                                               torch.int64)
        for (name, make), dtype in itertools.product(LAYOUTS.items(), dtypes):
            if name.startswith("expanded") and op._schema.name.endswith("_backward") and OLD_TORCH:
                continue  # torch 2.8's gelu_backward of an expanded grad corrupts the heap
            for args, outs in _eager_outputs(op, make().to(dtype), all_kinds=False):
                try:
                    fakes = _in_fake_mode(op, args)
                except RuntimeError:
                    continue  # a meta kernel stricter than eager: not a layout question
                for out, fake in zip(outs, fakes):
                    if isinstance(out, torch.Tensor) and out.stride() != fake.stride():
                        differ.setdefault(_named(op), (out.stride(), fake.stride()))
    assert not differ, differ


COMPOSITES = {
    "scalar_base_pow": lambda t: 2**t,
    "float_power_scalar_base": lambda t: torch.float_power(2, t),
    "masked_fill": lambda t: t.masked_fill(t > 0.9, 0.0),
    "masked_fill_0d_mask": lambda t: t.masked_fill(torch.tensor(True), 1.0),
    "lerp_scalar_weight": lambda t: torch.lerp(t, torch.ones(t.shape[-1:]), 0.3),
    "clamp_tensor_bounds": lambda t: torch.clamp(t, torch.tensor(0.1), torch.zeros(t.shape[-1:])),
    "logsigmoid": F.logsigmoid,
    "isinf_of_ints": lambda t: torch.isinf((t * 10).long()),
    "isfinite_of_bools": lambda t: torch.isfinite(t > 0.9),
    "complex_abs": lambda t: torch.complex(t, t).abs(),
    "complex_angle": lambda t: torch.complex(t, t).angle(),
    "complex_isinf": lambda t: torch.complex(t, t).isinf(),
    "ldexp_int": lambda t: torch.ldexp(t, torch.tensor(3)),
    "ldexp_float": lambda t: torch.ldexp(t.double(), torch.full(t.shape[-1:], 2.0)),
    "mvlgamma": lambda t: torch.mvlgamma(t + 2, 2),
    "isclose": lambda t: torch.isclose(t, t * 1.0),
}


@pytest.mark.parametrize("name", sorted(COMPOSITES))
@pytest.mark.parametrize("layout", sorted(k for k in LAYOUTS if k not in ("0d", "1d_size0")))
def test_fake_and_materialized_outputs_have_eagers_strides(name, layout):
    def build():
        torch.manual_seed(0)
        return COMPOSITES[name](LAYOUTS[layout]())

    eager = build()
    deferred = torchdefer.deferred_init(build)
    assert deferred.stride() == eager.stride()
    real = torchdefer.materialize_tensor(deferred)
    assert real.stride() == eager.stride() and torch.equal(real, eager)


def test_a_part_of_a_masked_column_views_as_bytes_as_in_eager():
    def build():
        t = torch.linspace(-2, 3, 6).unsqueeze(0).movedim(0, 1).masked_fill(torch.tensor(False), 0)
        return (2**t).split(2, 0)[1].view(torch.uint8)

    eager = build()
    real = torchdefer.materialize_tensor(torchdefer.deferred_init(build))
    assert real.stride() == eager.stride() and torch.equal(real, eager)
