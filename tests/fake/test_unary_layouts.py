"""Unary pointwise ops: fake and materialized outputs have eager's strides.

Their meta kernels lay out a fresh output otherwise than eager in size-1 and
size-0 dimensions (``torch.rand(6, 1).t().clamp(-1, 1)``), so ``.stride()``
differed from eager's, and ``.view(torch.uint8)`` of a part of it failed where
eager's worked (issue 24, fuzz seed 20261126). The sweep below re-derives the
tables of ``fake/_unary.py`` from the installed torch, so a torch that lays
out an op otherwise fails here, not silently.
"""

import pytest
import torch

import torchdefer
from torchdefer.fake._iterator import iterator_strides
from torchdefer.fake._unary import ITERATED, ITERATED_NAMES, LIKE_INPUT, LIKE_INPUT_NAMES


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


def _one_tensor_pointwise_overloads():
    """Every functional aten overload tagged pointwise whose one tensor argument is ``self``-like."""
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
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
    """'iterated', 'like_input', '' (neither predicts every layout) or None (never ran)."""
    iterated = like = True
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
                iterated &= iterator_strides([(tuple(t.shape), t.stride())], tuple(t.shape)) == o.stride()
                like &= torch.empty_like(t).stride() == o.stride()
    if not ran:
        return None
    return "iterated" if iterated else "like_input" if like else ""


def _named(op):
    name = op._schema.name.split("::")[1]
    return name if op._overloadname == "default" else f"{name}.{op._overloadname}"


def test_the_tables_are_what_sweeping_the_installed_torch_proves():
    assert len(ITERATED) == len(ITERATED_NAMES) and len(LIKE_INPUT) == len(LIKE_INPUT_NAMES)
    proved = {"iterated": set(), "like_input": set()}
    for op in _one_tensor_pointwise_overloads():
        rule = _rule_of(op)
        if rule:
            proved[rule].add(_named(op))
    assert proved["iterated"] == set(ITERATED_NAMES)
    # clone is laid out by the empty_like rule of fake/layout.py already
    assert proved["like_input"] - {"clone"} == set(LIKE_INPUT_NAMES)


OPS = {
    "abs": torch.abs,
    "clamp": lambda t: t.clamp(-1, 1),
    "softplus": torch.nn.functional.softplus,
    "hardtanh": torch.nn.functional.hardtanh,
    "relu6": torch.nn.functional.relu6,
    "nan_to_num": torch.nan_to_num,
    "frexp_mantissa": lambda t: torch.frexp(t)[0],
    "pow": lambda t: t**2,
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
