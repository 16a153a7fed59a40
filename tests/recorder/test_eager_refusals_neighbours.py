"""More of eager's kernel-only refusals, at the call (issue 24, class 4's neighbours).

Large tensors (their stand-ins are cut down, yet a refusal of scalar
arguments is the call's), ``multinomial``'s sizes and values, ``poisson``'s
rates (values recording reads at the call: leaving ``deferred_init`` would
run these ops on them anyway), and shape errors worded as eager words them.
Each case runs eagerly and deferred from the same seed: both raise, the
deferred error is a TorchdeferError of eager's type naming this file, and the
next random numbers agree. Value checks of ops whose draws are counted (a
``normal`` std tensor) are made when the op is replayed: tested below.
"""

from __future__ import annotations

import pytest
import torch

import torchdefer
from torchdefer.errors import ReplayError, TorchdeferError

BIG = (300, 300)  # more elements than the stand-ins keep

REFUSED = {
    # scalar arguments checked in the kernel, on tensors the stand-ins cut down
    "uniform_from_above_to": lambda: torch.empty(BIG).uniform_(2, 1),
    "uniform_to_inf": lambda: torch.empty(BIG).uniform_(0, float("inf")),
    "normal_negative_std": lambda: torch.empty(BIG).normal_(0, -1),
    "normal_nan_std": lambda: torch.empty(BIG).normal_(0, float("nan")),
    "bernoulli_p_above_one": lambda: torch.empty(BIG).bernoulli_(1.5),
    "bernoulli_p_below_zero": lambda: torch.empty(BIG).bernoulli_(-0.5),
    "random_from_above_to": lambda: torch.empty(BIG).random_(5, 2),
    "random_to_zero": lambda: torch.empty(BIG).random_(0),
    "random_uint8_out_of_range": lambda: torch.empty(BIG, dtype=torch.uint8).random_(0, 300),
    "randint_low_not_below_high": lambda: torch.randint(5, 5, BIG),
    "exponential_zero_lambda": lambda: torch.empty(BIG).exponential_(0),
    "geometric_p_one": lambda: torch.empty(BIG).geometric_(1),
    "geometric_p_zero": lambda: torch.empty(BIG).geometric_(0),
    "cauchy_zero_sigma": lambda: torch.empty(BIG).cauchy_(0, 0),
    "log_normal_negative_std": lambda: torch.empty(BIG).log_normal_(0, -1),
    "randperm_negative": lambda: torch.randperm(-1),
    "normal_scalar_negative_std_tensor_mean": lambda: torch.normal(torch.zeros(BIG), -1.0),
    # multinomial: sizes
    "multinomial_no_samples": lambda: torch.multinomial(torch.ones(3), 0),
    "multinomial_too_many_without_replacement": lambda: torch.multinomial(torch.ones(3), 5),
    "multinomial_too_many_of_a_large_input": lambda: torch.multinomial(torch.ones(70000), 70001),
    "multinomial_three_dims": lambda: torch.multinomial(torch.ones(2, 2, 3), 1),
    "multinomial_int_input": lambda: torch.multinomial(torch.ones(3, dtype=torch.long), 1),
    # multinomial and poisson: values (computed while building, read at the call)
    "multinomial_negative_weight": lambda: torch.multinomial(torch.ones(3) - 2, 1),
    "multinomial_all_zero_row": lambda: torch.multinomial(torch.ones(2, 3) * torch.tensor([[1.0], [0.0]]), 1),
    "multinomial_inf_weight": lambda: torch.multinomial(torch.ones(3) / 0, 1),
    "multinomial_nan_weight": lambda: torch.multinomial(torch.zeros(3) / 0, 1),
    "multinomial_negative_with_replacement": lambda: torch.multinomial(
        torch.ones(3) - 2, 4, replacement=True),
    "multinomial_negative_after_a_draw": lambda: (
        torch.randn(7), torch.multinomial(torch.rand(4) - 2, 1)),
    "multinomial_with_a_generator": lambda: torch.multinomial(
        torch.ones(3) - 2, 1, generator=torch.Generator().manual_seed(3)),
    "poisson_negative_rate": lambda: torch.poisson(torch.ones(4) - 2),
    "poisson_nan_rate": lambda: torch.poisson(torch.zeros(4) / 0),
    # shapes the meta kernels word otherwise
    "mm_shapes": lambda: torch.mm(torch.ones(2, 3), torch.ones(4, 5)),
    "matmul_shapes": lambda: torch.ones(2, 3) @ torch.ones(4, 5),
    "linear_shapes": lambda: torch.nn.functional.linear(torch.ones(2, 3), torch.ones(5, 4)),
    "addmm_shapes": lambda: torch.addmm(torch.ones(2, 5), torch.ones(2, 3), torch.ones(4, 5)),
}

ACCEPTED = {
    "multinomial_of_computed_weights": lambda: torch.multinomial(torch.rand(3, 5) + 0.1, 2),
    "multinomial_with_replacement": lambda: torch.multinomial(torch.rand(6) + 0.1, 9, True),
    "poisson_of_computed_rates": lambda: torch.poisson(torch.rand(4, 4) * 3),
    "uniform_of_a_large_tensor": lambda: torch.empty(BIG).uniform_(-1, 1),
    "mm_of_matching_shapes": lambda: torch.mm(torch.ones(2, 3), torch.ones(3, 5)),
    # the weights read at the call stay writable afterwards, as any deferred tensor
    "weights_written_after_multinomial": lambda: (lambda w: (
        torch.multinomial(w, 2), w.mul_(2), torch.poisson(w), w.add_(1))[-1])(torch.rand(3) + 0.5),
}


def _outcome(fn):
    try:
        return fn(), None
    except Exception as error:  # compared below
        return None, error


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_eager_refuses_is_refused_at_the_call_with_eagers_words(name):
    torch.manual_seed(0)
    _, eager_error = _outcome(REFUSED[name])
    eager_next = torch.rand(4)
    assert eager_error is not None, "eager accepts it: the case is wrong"
    torch.manual_seed(0)
    _, error = _outcome(lambda: torchdefer.deferred_init(REFUSED[name]))
    assert torch.equal(torch.rand(4), eager_next), "the generator moved unlike eager's"
    assert isinstance(error, type(eager_error)), f"{type(error)}: {error}"
    assert isinstance(error, TorchdeferError), f"{type(error)}: {error}"
    assert "test_eager_refusals_neighbours.py" in str(error)
    assert str(eager_error).splitlines()[0].strip() in str(error)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_what_eager_accepts_is_recorded_and_replays_eagers_values(name):
    torch.manual_seed(0)
    eager = ACCEPTED[name]()
    eager_next = torch.rand(4)
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(ACCEPTED[name])
    assert torch.equal(torch.rand(4), eager_next)
    assert torch.equal(torchdefer.materialize_tensor(lazy), eager)


COUNTED = {
    "normal_negative_std_tensor": lambda: torch.normal(0.0, torch.ones(3) - 2),
    "normal_negative_std_and_mean_tensors": lambda: torch.normal(torch.zeros(3), torch.ones(3) - 2),
    "bernoulli_p_tensor_above_one": lambda: torch.bernoulli(torch.ones(3) * 2),
    "bernoulli_inplace_p_tensor_below_zero": lambda: torch.empty(3).bernoulli_(torch.ones(3) - 2),
}


@pytest.mark.parametrize("name", sorted(COUNTED))
def test_a_value_check_of_a_counted_draw_is_refused_at_replay_naming_the_call(name):
    # Its draws are counted, never run while building, so its values are not
    # read there; replaying it runs eager's kernel, which refuses them.
    with pytest.raises(RuntimeError) as eager:
        COUNTED[name]()
    lazy = torchdefer.deferred_init(COUNTED[name])
    with pytest.raises(ReplayError) as error:
        torchdefer.materialize_tensor(lazy)
    assert isinstance(error.value, RuntimeError)
    assert "test_eager_refusals_neighbours.py" in str(error.value)
    assert str(eager.value).splitlines()[0].strip()[:40] in str(error.value)


def test_a_multinomial_read_at_the_call_is_not_recorded_as_a_read():
    # The check reads the weights; the recorded graph replays as before.
    def build():
        w = torch.rand(4, 6) + 0.5
        return w, torch.multinomial(w, 3)

    torch.manual_seed(1)
    eager = build()
    torch.manual_seed(1)
    lazy = torchdefer.deferred_init(build)
    for got, want in zip(reversed(lazy), reversed(eager)):
        assert torch.equal(torchdefer.materialize_tensor(got), want)
