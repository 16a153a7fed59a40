"""Neighbours of the draw-model fixes: data-dependent scratch runs, refusals, mixed dtypes."""

import pytest
import torch
from test_draw_sweep import _mixed_signs

import torchdefer
from parity import assert_same_tensor, check_program


def test_in_place_rrelu_draws_as_many_as_eager_when_only_a_later_draw_is_materialized():
    """A scratch run of rrelu_ read uninitialized memory: a silent wrong value for the later draw."""

    def build():
        x = _mixed_signs(torch.empty(4, 5))
        torch.rrelu_(x, training=True)
        return x, torch.rand(3), torch.randn(20)

    torch.manual_seed(4)
    eager = build()
    for order in ((1,), (2, 0, 1), (0, 1, 2)):
        torch.manual_seed(4)
        deferred = torchdefer.deferred_init(build)
        for i in order:
            assert_same_tensor(torchdefer.materialize_tensor(deferred[i]), eager[i], f"output {i}")


@pytest.mark.parametrize(
    "op",
    [
        lambda: torch.binomial(torch.full((4,), 10.0), torch.full((4,), 0.3)),
        lambda: torch._sample_dirichlet(torch.full((4, 3), 0.7)),
        lambda: torch.distributions.Beta(torch.full((5,), 2.0), 3.0).sample(),
    ],
    ids=["binomial", "sample_dirichlet", "beta"],
)
def test_random_ops_without_a_meta_kernel_are_refused_at_the_users_line(op):
    """No meta kernel means no output to record: a clear error, not a guess."""
    from torchdefer.errors import RecordingError

    with pytest.raises(RecordingError, match=r"cannot be recorded.*test_draw_neighbours\.py"):
        torchdefer.deferred_init(op)


@torchdefer.composite
def _refill_negatives_(t):
    """Draws one number per negative element it finds: its draws depend on ``t``'s values."""
    negative = t < 0
    t[negative] = torch.rand(int(negative.sum()))
    return t


def test_a_composite_drawing_by_the_values_it_writes_places_later_draws_as_eager():
    """A scratch run of a user composite read uninitialized memory (a silent wrong value)."""

    def build():
        x = _mixed_signs(torch.empty(4, 5))
        _refill_negatives_(x)
        return x, torch.rand(3)

    torch.manual_seed(6)
    eager = build()
    for order in ((1,), (1, 0), (0, 1)):
        torch.manual_seed(6)
        deferred = torchdefer.deferred_init(build)
        for i in order:
            assert_same_tensor(torchdefer.materialize_tensor(deferred[i]), eager[i], f"output {i}")


MIXED = {
    "normal_half_mean_double_std": lambda: torch.normal(
        torch.zeros(20, 4, dtype=torch.float16).t(), torch.ones(4, 20, dtype=torch.float64)
    ),
    "normal_bfloat16_mean_transposed_std": lambda: torch.normal(
        torch.zeros(4, 20, dtype=torch.bfloat16), torch.ones(20, 4).t()
    ),
    "normal_out_of_another_dtype": lambda: torch.normal(
        torch.zeros(4, 20), torch.ones(4, 20), out=torch.empty(20, 4, dtype=torch.float64).t()
    ),
    "bernoulli_out_of_another_dtype": lambda: torch.bernoulli(
        torch.full((20, 4), 0.3, dtype=torch.float64),
        out=torch.empty(4, 20, dtype=torch.float16).t(),
    ),
    "normal_0d_mean_broadcast": lambda: torch.normal(torch.tensor(1.0), torch.ones(20, 4).t()),
    "normal_0d_both": lambda: torch.normal(torch.tensor(1.0), torch.tensor(2.0)),
}


@pytest.mark.parametrize("order", [None, [2, 1, 0]])
@pytest.mark.parametrize("name", sorted(MIXED))
def test_random_ops_with_mixed_dtypes_and_0d_arguments_match_eager(name, order):
    check_program(
        lambda defer: defer(lambda: (torch.randn(3), MIXED[name](), torch.rand(3))), order
    )
