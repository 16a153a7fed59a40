"""Random ops of other libraries, tagged or not, take their place in the stream."""

import pytest
import torch

import torchdefer
from parity import check_program
from torchdefer.errors import UntaggedRandomOpError


@torch.library.custom_op("tdtest::noisy_", mutates_args=("t",))
def noisy_(t: torch.Tensor) -> None:
    t.copy_(torch.randn(t.shape, dtype=t.dtype))


@noisy_.register_fake
def _(t):
    return None


@torch.library.custom_op(
    "tdtest::tagged_noisy_", mutates_args=("t",), tags=(torch.Tag.nondeterministic_seeded,)
)
def tagged_noisy_(t: torch.Tensor) -> None:
    t.copy_(torch.randn(t.shape, dtype=t.dtype))


@tagged_noisy_.register_fake
def _(t):
    return None


_lib = torch.library.Library("tdtest", "FRAGMENT")
_lib.define("noisy_with(Tensor(a!) t, *, Generator? generator=None) -> ()")


def _noisy_with(t, *, generator=None):
    t.copy_(torch.rand(t.shape, dtype=t.dtype, generator=generator))


_lib.impl("noisy_with", _noisy_with, "CPU")
_lib.impl("noisy_with", lambda t, *, generator=None: None, "Meta")
noisy_with = torch.ops.tdtest.noisy_with


def _build(op, **kwargs):
    def build():
        a = torch.empty(20)
        op(a, **kwargs)
        return a, torch.randn(5)

    return build


def test_a_tagged_custom_random_op_matches_eager_and_keeps_the_stream():
    check_program(lambda defer: defer(_build(tagged_noisy_)))


def test_a_custom_op_taking_a_generator_is_recorded_as_random():
    def build():
        g = torch.Generator().manual_seed(3)
        a = torch.empty(20)
        noisy_with(a, generator=g)
        return a, g

    check_program(lambda defer: defer(build))


def test_an_untagged_custom_op_drawing_from_the_default_generator_matches_eager():
    check_program(lambda defer: defer(_build(noisy_)), order=[1, 0])


def test_a_function_marked_not_random_that_draws_is_refused_at_replay():
    @torchdefer.composite(random=False)
    def sneaky_(t):
        t.copy_(torch.randn(t.shape))

    got = torchdefer.deferred_init(lambda: sneaky_(torch.empty(6)))
    before = torch.get_rng_state()
    with pytest.raises(UntaggedRandomOpError, match=r"sneaky_.*not tagged as random"):
        torchdefer.materialize_tensor(got)
    assert torch.equal(torch.get_rng_state(), before)
