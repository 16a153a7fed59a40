"""Pointwise ops: fake and materialized outputs have eager's strides.

Their meta kernels lay out a fresh output otherwise than eager in size-1 and
size-0 dimensions (``torch.rand(6, 1).t().clamp(-1, 1)``), so ``.stride()``
differed from eager's, and ``.view(torch.uint8)`` of a part of it failed where
eager's worked; ``torch.ones(1, 37).t() * 2`` likewise (issue 24, fuzz seed
20261126). The sweeps below re-derive the tables of ``fake/_pointwise.py``
from the installed torch, so a torch that lays
out an op otherwise fails here, not silently.
"""

import itertools

import pytest
import torch

import torchdefer
from torchdefer.fake._iterator import iterator_strides
from torchdefer.fake._pointwise import (
    BINARY_ITERATED,
    BINARY_ITERATED_NAMES,
    ITERATED,
    ITERATED_NAMES,
    LIKE_INPUT,
    LIKE_INPUT_NAMES,
    TERNARY_ITERATED,
    TERNARY_ITERATED_NAMES,
    WITH_SCALAR,
    WITH_SCALAR_NAMES,
)


def _base(*size):
    return torch.rand(*size) + 0.5


LAYOUTS = {
    "permuted_size1": lambda: _base(3, 1, 4).permute(2, 0, 1),
    "movedim_column": lambda: _base(6, 1).movedim(0, 1),
    "transposed_row": lambda: _base(1, 6).t(),
    "movedim_size1_middle": lambda: _base(2, 1, 3).movedim(2, 0),
    "permuted": lambda: _base(2, 3, 4).permute(2, 0, 1),
    "size0_permuted": lambda: _base(2, 0, 3).permute(1, 2, 0),
    "size0_transposed": lambda: _base(0, 3).t(),
    "expanded": lambda: _base(3, 1).expand(3, 4),
    # strides (1, 0, 1): empty_like keeps the order (hardtanh; fuzz seed 20261214)
    "expanded_moved": lambda: _base(7).expand(2, 7).unsqueeze(-1).movedim(-1, 0),
    "strided_columns": lambda: _base(4, 6)[:, ::2],
    "sliced_rows": lambda: _base(4, 6)[1:3],
    "channels_last": lambda: _base(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
    "channels_last_1x1": lambda: _base(2, 3, 1, 1).contiguous(memory_format=torch.channels_last),
    "channels_last_c1": lambda: _base(2, 1, 4, 5).contiguous(memory_format=torch.channels_last),
    "0d": lambda: torch.tensor(1.5),
    "1d": lambda: _base(5),
    "1d_strided": lambda: _base(10)[::2],
    "size1_reversed": lambda: _base(1, 1, 3).permute(2, 1, 0),
    "1d_size1": lambda: _base(1),
    "1d_size0": lambda: _base(0),
    "transposed": lambda: _base(3, 4).t(),
}
DTYPES = (torch.float32, torch.int64, torch.bool)


def _aten_overloads():
    """Every aten overload registered (``dir(torch.ops.aten)`` lists only those used yet)."""
    for full in sorted(torch._C._dispatch_get_all_op_names()):
        namespace, _, name = full.partition("::")
        if namespace != "aten":
            continue
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet, None), overload or "default", None)
        if isinstance(op, torch._ops.OpOverload):
            yield op


def _one_tensor_pointwise_overloads():
    """Every functional aten overload tagged pointwise whose one tensor argument is ``self``-like."""
    for op in _aten_overloads():
        schema = op._schema
        if torch.Tag.pointwise not in op.tags or schema.is_mutable:
            continue
        if any(r.alias_info is not None for r in schema.returns):
            continue
        tensors = [a for a in schema.arguments if "Tensor" in str(a.type)]
        if len(tensors) == 1 and str(tensors[0].type) == "Tensor":
            yield op


def _call(op, t):
    args = []
    for a in op._schema.arguments:
        if a.has_default_value():
            break
        kind = str(a.type)
        if kind == "Tensor":
            args.append(t)
        elif kind in ("Scalar", "number", "float"):
            args.append(0.5 if t.dtype.is_floating_point else 2)
        elif kind == "int":
            args.append(1)
        elif kind == "bool":
            args.append(False)
        else:
            raise TypeError(f"{op}: no value for an argument of type {kind}")
    kwargs = {"min": -0.25} if op._schema.name in ("aten::clamp", "aten::clip") else {}
    return op(*args, **kwargs)


def _rule_of(op):
    """'iterated', 'with_scalar', 'like_input', '' (none predicts every layout) or
    None (never ran)."""
    iterated = scalar = like = True
    ran = False
    for make in LAYOUTS.values():
        for dtype in DTYPES:
            t = make().to(dtype)
            try:
                out = _call(op, t)
            except (RuntimeError, NotImplementedError, TypeError):
                continue  # a dtype or argument the op refuses
            for o in out if isinstance(out, tuple) else (out,):
                ran = True
                if o.shape != t.shape:
                    return ""
                layout = (tuple(t.shape), t.stride())
                iterated &= iterator_strides([layout], tuple(t.shape)) == o.stride()
                scalar &= iterator_strides([layout, ((), ())], tuple(t.shape)) == o.stride()
                like &= torch.empty_like(t).stride() == o.stride()
    if not ran:
        return None
    if iterated:
        return "iterated"
    return "with_scalar" if scalar else "like_input" if like else ""


def _named(op):
    name = op._schema.name.split("::")[1]
    return name if op._overloadname == "default" else f"{name}.{op._overloadname}"


def test_the_tables_are_what_sweeping_the_installed_torch_proves():
    assert len(ITERATED) == len(ITERATED_NAMES) and len(LIKE_INPUT) == len(LIKE_INPUT_NAMES)
    assert len(WITH_SCALAR) == len(WITH_SCALAR_NAMES)
    proved = {"iterated": set(), "with_scalar": set(), "like_input": set()}
    swept = set(_one_tensor_pointwise_overloads())
    # an op of the tables that this torch does not tag pointwise (leaky_relu before
    # 2.12) is swept all the same: its layout must still be what the table says
    tabled = ITERATED | WITH_SCALAR | LIKE_INPUT
    for op in sorted(swept | tabled, key=str):
        rule = _rule_of(op)
        if rule:
            proved[rule].add(_named(op))
    assert proved["iterated"] == set(ITERATED_NAMES)
    assert proved["with_scalar"] == set(WITH_SCALAR_NAMES)
    # clone is laid out by the empty_like rule of fake/_layout.py already
    assert proved["like_input"] - {"clone"} == set(LIKE_INPUT_NAMES)


def _two_tensor_pointwise_overloads():
    for op in _aten_overloads():
        schema = op._schema
        if torch.Tag.pointwise not in op.tags or schema.is_mutable:
            continue
        if any(r.alias_info is not None for r in schema.returns):
            continue
        required = [str(a.type) for a in schema.arguments if not a.has_default_value()]
        if required == ["Tensor", "Tensor"]:
            yield op


def _partners(t):
    yield torch.tensor(2.0)  # what a Python number becomes
    yield torch.full(t.shape, 2.0)
    if t.dim():
        yield torch.full(t.shape[-1:], 2.0)


def _iterator_predicts(op):
    """Whether TensorIterator's rule gave every output's strides (None: never ran)."""
    ran = False
    for make in LAYOUTS.values():
        for dtype in (torch.float32, torch.int64):
            t = make().to(dtype)
            for partner in _partners(t):
                for a, b in ((t, partner.to(dtype)), (partner.to(dtype), t)):
                    try:
                        out = op(a, b)
                    except (RuntimeError, NotImplementedError, TypeError):
                        continue
                    if not isinstance(out, torch.Tensor):
                        return False
                    ran = True
                    operands = (a, b)
                    if op is torch.ops.aten.float_power.Tensor_Tensor:  # .to(double) first
                        operands = tuple(x if x.dtype == out.dtype else
                                         torch.empty_like(x, dtype=out.dtype) for x in operands)
                    want = iterator_strides([(tuple(x.shape), x.stride()) for x in operands],
                                            tuple(out.shape))
                    if out.stride() != want:
                        return False
    return ran or None


def test_the_binary_table_is_what_sweeping_the_installed_torch_proves():
    assert len(BINARY_ITERATED) == len(BINARY_ITERATED_NAMES)
    crashing = set()
    if torch.__version__ < "2.12":  # torch 2.8's gelu_backward corrupts the heap on these layouts
        crashing.add(torch.ops.aten.gelu_backward.default)
    swept = set(_two_tensor_pointwise_overloads()) | BINARY_ITERATED  # complex: untagged
    proved = {_named(op) for op in swept if op not in crashing and _iterator_predicts(op)}
    assert proved == set(BINARY_ITERATED_NAMES) - {_named(op) for op in crashing}


def _three_tensor_pointwise_overloads():
    for op in _aten_overloads():
        schema = op._schema
        if torch.Tag.pointwise not in op.tags or schema.is_mutable:
            continue
        if any(r.alias_info is not None for r in schema.returns):
            continue
        required = [str(a.type) for a in schema.arguments if not a.has_default_value()]
        if required == ["Tensor"] * 3:
            yield op


def _iterator_predicts_three(op):
    ran = False
    for make in LAYOUTS.values():
        t = make()
        for partner in _partners(t):
            for operands in itertools.permutations((t, partner, torch.tensor(0.5))):
                if op._schema.name == "aten::where":
                    operands = (operands[0] > 0.7, *operands[1:])
                try:
                    out = op(*operands)
                except (RuntimeError, NotImplementedError, TypeError):
                    continue
                if not isinstance(out, torch.Tensor):
                    return False
                ran = True
                want = iterator_strides([(tuple(a.shape), a.stride()) for a in operands],
                                        tuple(out.shape))
                if out.stride() != want:
                    return False
    return ran or None


def test_the_ternary_table_is_what_sweeping_the_installed_torch_proves():
    assert len(TERNARY_ITERATED) == len(TERNARY_ITERATED_NAMES)
    proved = {_named(op) for op in _three_tensor_pointwise_overloads()
              if _iterator_predicts_three(op)}
    assert proved == set(TERNARY_ITERATED_NAMES)


BINARY = {
    "times_2": lambda t: t * 2,
    "plus_row": lambda t: t + torch.ones(t.shape[-1:]),
    "rsub_0d": lambda t: torch.tensor(3.0) - t,
    "maximum": lambda t: torch.maximum(t, torch.zeros(t.shape)),
    "eq": lambda t: t == 1.0,
    "where": lambda t: torch.where(t > 0.7, t, torch.tensor(0.0)),
    "addcmul": lambda t: torch.addcmul(t, torch.tensor(2.0), t, value=0.5),
    "lerp_keyword": lambda t: torch.lerp(t, end=torch.ones(t.shape[-1:]), weight=torch.tensor(0.3)),
}


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("layout", sorted(k for k in LAYOUTS if k != "0d"))
def test_binary_fake_and_materialized_outputs_have_eagers_strides(op, layout):
    def build():
        torch.manual_seed(0)
        return BINARY[op](LAYOUTS[layout]())

    eager = build()
    deferred = torchdefer.deferred_init(build)
    assert deferred.stride() == eager.stride()
    real = torchdefer.materialize_tensor(deferred)
    assert real.stride() == eager.stride() and torch.equal(real, eager)


OPS = {
    "abs": torch.abs,
    "clamp": lambda t: t.clamp(-1, 1),
    "softplus": torch.nn.functional.softplus,
    "hardtanh": torch.nn.functional.hardtanh,
    "relu6": torch.nn.functional.relu6,
    "nan_to_num": torch.nan_to_num,
    "frexp_mantissa": lambda t: torch.frexp(t)[0],
    "pow": lambda t: t**2,
    "eq_scalar": lambda t: t == 1.0,
    "add_scalar": lambda t: torch.ops.aten.add.Scalar(t, 2),
    "rsub_scalar": lambda t: torch.ops.aten.rsub.Scalar(t, 2),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("layout", sorted(k for k in LAYOUTS if k != "0d"))
def test_fake_and_materialized_outputs_have_eagers_strides(op, layout):
    def build():
        torch.manual_seed(0)
        return OPS[op](LAYOUTS[layout]())

    eager = build()
    deferred = torchdefer.deferred_init(build)
    assert deferred.stride() == eager.stride()
    real = torchdefer.materialize_tensor(deferred)
    assert real.stride() == eager.stride() and torch.equal(real, eager)


def test_a_part_of_a_clamped_column_views_as_bytes_as_in_eager():
    def build():
        torch.manual_seed(0)
        t = torch.linspace(-2, 3, 6).unsqueeze(0).movedim(0, 1).clamp(-1, 1)
        return t.split(2, 0)[1].view(torch.uint8)

    eager = build()
    real = torchdefer.materialize_tensor(torchdefer.deferred_init(build))
    assert real.stride() == eager.stride() and torch.equal(real, eager)
