"""Dtypes a CPU kernel lacks, on the common dtypes too, refused at the call as eager does.

``hypot`` on int64, ``bitwise_and`` on float16, ``gelu`` on int64 ("not
implemented for 'Long'"): the meta kernels accept them, so they were recorded
and refused only at replay, far from the user's line. Eager is asked once per
op, dtypes and argument types. And the ops whose meta kernel refuses what
eager accepts (``where`` with a uint8 condition, ``nan_to_num_`` of complex)
record as eager runs them. Pointwise kernels' RuntimeErrors of dtypes and
scalar arguments (relu of bool, maximum of complex) are refused at the call
too. Found by a sweep of every pointwise overload.
"""

import warnings

import pytest
import torch

import torchdefer
from torchdefer.recorder import _refusals


def _ints():
    return torch.tensor([1, 2, 3])


REFUSED = {
    "hypot of int64": lambda: torch.hypot(_ints(), _ints()),
    "lerp of int64": lambda: torch.lerp(_ints(), _ints(), _ints()),
    "gelu of int64": lambda: torch.nn.functional.gelu(_ints()),
    "silu of int64": lambda: torch.nn.functional.silu(_ints()),
    "frac of int64": lambda: torch.frac(_ints()),
    "bitwise_and of float16": lambda: torch.ones(3, dtype=torch.float16).bitwise_and(
        torch.ones(3, dtype=torch.float16)),
    "bitwise_not of float32": lambda: torch.ones(3).bitwise_not(),
    "gcd of int64 and float32": lambda: torch.gcd(_ints(), torch.ones(3)),
    "in-place hypot of int64": lambda: _ints().hypot_(_ints()),
    "hypot of empty int64": lambda: torch.hypot(_ints()[:0], _ints()[:0]),
    "zeta of float16": lambda: torch.special.zeta(torch.ones(3, dtype=torch.float16),
                                                  torch.ones(3, dtype=torch.float16)),
    # pointwise kernels' RuntimeErrors of dtypes and scalar arguments
    "relu of bool": lambda: torch.ones(3, dtype=torch.bool).relu(),
    "maximum of complex": lambda: torch.ones(3, dtype=torch.complex64).maximum(
        torch.ones(3, dtype=torch.complex64)),
    "in-place mul of bool by int64": lambda: torch.ones(3, dtype=torch.bool).mul_(_ints()),
    "int64 to a negative power": lambda: _ints().pow(-1),
}
ACCEPTED = {
    "hypot of float32": lambda: torch.hypot(torch.ones(3), torch.full((3,), 2.0)),
    "gelu of float32": lambda: torch.nn.functional.gelu(torch.linspace(-1, 1, 5)),
    "bitwise_and of int64": lambda: _ints().bitwise_and(_ints()),
    "where with a uint8 condition": lambda: torch.where(
        torch.tensor([1, 0, 1], dtype=torch.uint8), torch.ones(3), torch.zeros(3)),
    "where with a uint8 condition and a scalar": lambda: torch.where(
        torch.tensor([1, 0, 1], dtype=torch.uint8), 2.0, torch.zeros(3)),
    "nan_to_num_ of complex": lambda: torch.tensor([1 + 1j, 2]).nan_to_num_(),
    "nan_to_num_ of float": lambda: torch.tensor([1.0, float("nan")]).nan_to_num_(nan=3.0),
    "int64 to a positive power": lambda: _ints().pow(2),
    "relu of int64": lambda: _ints().relu(),
    # twins of a large tensor are cut to two elements a dimension, a small one's
    # are not: the broadcast still holds in eager (orthogonal_'s q *= ph)
    "in-place mul of a large matrix by a row": lambda: torch.ones(300, 300).mul_(
        torch.ones(300)),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_the_kernel_lacks_is_refused_at_the_call(name):
    build = REFUSED[name]
    # torch 2.15 raises TypeError for maximum of complex (2.13: RuntimeError)
    with pytest.raises((NotImplementedError, RuntimeError, TypeError)) as eager:
        build()
    for _ in range(2):  # asked, then answered from what was asked
        with pytest.raises(type(eager.value), match="eager PyTorch refuses") as deferred:
            torchdefer.deferred_init(build)
        assert isinstance(deferred.value, torchdefer.TorchdeferError)
        assert str(eager.value).splitlines()[0] in str(deferred.value)
        assert __file__ in str(deferred.value)  # the user's line


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_what_eager_accepts_records_and_replays_eagers_values(name):
    build = ACCEPTED[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # where's uint8 condition is deprecated
        eager = build()
        deferred = torchdefer.deferred_init(build)
        got = torchdefer.materialize_tensor(deferred)
    assert (got.dtype, got.shape) == (eager.dtype, eager.shape)
    assert torch.equal(got, eager)


def test_a_signature_is_asked_once():
    def build():
        return torch.hypot(torch.ones(4, 5), torch.ones(4, 5))

    torchdefer.deferred_init(build)
    key = _refusals._gap_key(torch.ops.aten.hypot.default, (torch.ones(1), torch.ones(1)), {})
    assert key in _refusals._gap_verdicts and _refusals._gap_verdicts[key] is None
    assert not _refusals.dtypes_unasked(torch.ops.aten.hypot.default,
                                        (torch.ones(7), torch.ones(7)), {})


def test_a_refusal_of_the_values_is_left_to_replay():
    # Integer division by a zero among the values: no twin proves it (their
    # values are not the data), so it is refused when replayed, naming the call.
    def build():
        return torch.arange(3) % torch.arange(3)

    with pytest.raises(RuntimeError):
        build()
    deferred = torchdefer.deferred_init(build)
    with pytest.raises(torchdefer.TorchdeferError, match=__file__.rsplit("/", 1)[-1]):
        torchdefer.materialize_tensor(deferred)
