"""The draw model against the real generator: sizes, dtypes, layouts, cached normals."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchdefer
from parity import assert_same_tensor
from torchdefer.rng import draws

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
OPS = {
    "normal_": lambda t, g: t.normal_(0.5, 2.0, generator=g),
    "uniform_": lambda t, g: t.uniform_(-3, 1, generator=g),
    "bernoulli_": lambda t, g: t.bernoulli_(0.3, generator=g),
    "bernoulli_tensor": lambda t, g: t.bernoulli_(torch.full_like(t, 0.4), generator=g),
    "exponential_": lambda t, g: t.exponential_(2.0, generator=g),
    "geometric_": lambda t, g: t.geometric_(0.4, generator=g),
    "cauchy_": lambda t, g: t.cauchy_(generator=g),
    "log_normal_": lambda t, g: t.log_normal_(generator=g),
    "random_": lambda t, g: t.random_(generator=g),
    "random_to": lambda t, g: t.random_(0, 50, generator=g),
    "randn_like": lambda t, g: torch.randn_like(t),
    "rand_like": lambda t, g: torch.rand_like(t),
}


def _program(op, dtype, shape, transpose, cached):
    def build():
        g = torch.Generator().manual_seed(21)
        if cached:  # leave a cached normal sample in both generators
            torch.empty(1, dtype=torch.float64).normal_(generator=g)
            torch.randn(1)
        t = torch.empty(shape, dtype=dtype)
        t = t.t() if transpose else t
        out = OPS[op](t, g)
        return out, g

    return build


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from(sorted(OPS)),
    dtype=st.sampled_from(FLOATS),
    shape=st.tuples(st.integers(1, 9), st.integers(1, 41)),
    transpose=st.booleans(),
    cached=st.booleans(),
)
def test_every_draw_matches_eager_and_leaves_generators_where_eager_does(
    op, dtype, shape, transpose, cached
):
    build = _program(op, dtype, shape, transpose, cached)
    torch.manual_seed(5)
    ref, ref_g = build()
    ref_state = torch.get_rng_state()
    torch.manual_seed(5)
    out, g = torchdefer.deferred_init(build)
    assert torch.equal(torch.get_rng_state(), ref_state)
    assert torch.equal(g.get_state(), ref_g.get_state())
    assert_same_tensor(torchdefer.materialize_tensor(out), ref)


def test_ops_without_a_model_are_reported_unmodeled():
    probs = torch.rand(3, 4)
    func = torch.ops.aten.multinomial.default
    assert draws.effect(func, (probs, 2), {}, torch.empty(3, 2, dtype=torch.int64)) is None


def test_random_ops_without_the_seeded_tag_are_still_random():
    assert draws.known_random_op(torch.ops.aten.random_.default)
    assert draws.known_random_op(getattr(torch.ops.aten.random_, "from"))
    assert not draws.known_random_op(torch.ops.aten.add_.Tensor)
