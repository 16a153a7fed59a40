"""Shifts of bool tensors: eager's type promotion where the meta kernel refuses.

``torch.tensor([True]) << 2`` is int64 ``[4]`` in eager; the meta kernel of
``__lshift__`` refuses bool ("Expected input tensor to have an integral
dtype"), so recording refused what eager accepts. What eager refuses
(``bool << bool``, a float shift, an in-place shift into bool) is still
refused at the call with eager's error.
"""

import pytest
import torch

import torchdefer


def _bools():
    return torch.tensor([True, False, True])


CASES = {
    "lshift by an int": lambda: _bools() << 2,
    "rshift by an int": lambda: _bools() >> 1,
    "lshift by an int tensor": lambda: _bools() << torch.tensor(3),
    "rshift by an int tensor": lambda: _bools() >> torch.tensor([1, 0, 2]),
    "an int scalar shifted by bools": lambda: 3 << _bools(),
    "int8 shifted by bools": lambda: torch.full((3,), 5, dtype=torch.int8) >> _bools(),
    "lshift by a bool tensor": lambda: _bools() << torch.tensor(True),
    "lshift by a float": lambda: _bools() << 2.5,
    "in-place lshift of bools": lambda: _bools().__ilshift__(2),
    "in-place rshift of bools": lambda: _bools().__irshift__(torch.tensor(1)),
    "in-place lshift of int64 by bools": lambda: torch.ones(3, dtype=torch.int64).__ilshift__(_bools()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_shift_records_as_eager_runs_it(name):
    build = CASES[name]
    try:
        eager = build()
    except Exception as refusal:
        with pytest.raises(type(refusal)):
            torchdefer.deferred_init(build)
        return
    deferred = torchdefer.deferred_init(build)
    assert deferred.dtype == eager.dtype
    got = torchdefer.materialize_tensor(deferred)
    assert got.dtype == eager.dtype and torch.equal(got, eager)
