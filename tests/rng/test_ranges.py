"""Element models: any part of a random call, drawn alone, equals that part of the whole call."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchdefer.rng import _ranges as ranges
from torchdefer.rng import draws, mt19937

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
CALLS = {
    "uniform_": (False, lambda out, g: out.uniform_(-2, 3, generator=g)),
    "normal_": (True, lambda out, g: out.normal_(0.5, 2.0, generator=g)),
    "exponential_": (False, lambda out, g: out.exponential_(1.5, generator=g)),
    "random_": (False, lambda out, g: out.random_(0, 200, generator=g)),
}


def _runner(call):
    def run(out: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        g = torch.Generator()
        g.set_state(state)
        call(out, g)
        return g.get_state()

    return run


_aten = torch.ops.aten
OVERLOADS = {
    "uniform_": (_aten.uniform_.default, (-2.0, 3.0)),
    "normal_": (_aten.normal_.default, (0.5, 2.0)),
    "exponential_": (_aten.exponential_.default, (1.5,)),
    "random_": (getattr(_aten.random_, "from"), (0, 200)),
}


def _effect_of(name, dtype):
    func, scalars = OVERLOADS[name]

    def effect_of(n: int):
        drawn = torch.empty(n, dtype=dtype, device="meta")
        return draws.effect(func, (drawn, *scalars), {}, drawn)

    return effect_of


def _model(name, dtype):
    blocks, call = CALLS[name]
    model = ranges.element_model(
        ("test", name, dtype), blocks, _effect_of(name, dtype), _runner(call), dtype,
        torch.device("cpu"),
    )
    assert model is not None, f"{name} on {dtype} should slice"
    return model


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(sorted(CALLS)),
    dtype=st.sampled_from(FLOATS),
    n=st.integers(16, 2000),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_any_range_of_a_call_equals_that_range_of_the_whole_call(name, dtype, n, cut):
    model = _model(name, dtype)
    _, call = CALLS[name]
    state = torch.Generator().manual_seed(n).get_state()
    whole = torch.empty(n, dtype=dtype)
    _runner(call)(whole, state)
    total = _effect_of(name, dtype)(n).words
    s = int(cut[0] * (n - 1))
    e = s + 1 + int(cut[1] * (n - 1 - s))
    out = torch.empty(e - s, dtype=dtype)
    ranges.draw_range(model, n, total, s, e, out, lambda w: mt19937.advance(state, w),
                      _runner(call))
    assert torch.equal(out, whole[s:e]), f"{name} {dtype} n={n} [{s}, {e})"


@pytest.mark.parametrize("dtype", FLOATS)
def test_normal_takes_the_last_sixteen_uniforms_for_a_remainder(dtype):
    """float32/64 draw a uniform per element then 16 more; float16/bfloat16 whole
    blocks since torch 2.13 (before, as float32): the model reads which from the counts."""
    model = _model("normal_", dtype)
    assert model.blocks and model.words == (2 if dtype == torch.float64 else 1)
    conventions = {"element then 16": lambda n: n + 16, "whole blocks": lambda n: -(-n // 16) * 16}
    followed = [name for name, uniforms in conventions.items()
                if all(_effect_of("normal_", dtype)(n).words == model.words * uniforms(n)
                       for n in (17, 31, 33, 1000))]
    assert followed == ["element then 16"] if dtype in (torch.float32, torch.float64) else followed


def test_a_call_whose_pieces_differ_from_the_whole_is_not_sliced():
    """A kernel that reverses its output draws per element by the word count, but its
    element i does not come from words [i, i + 1): the probe catches it."""

    def reversed_uniform(out, g):
        out.copy_(torch.empty_like(out).uniform_(generator=g).flip(0))

    effect_of = _effect_of("uniform_", torch.float32)
    model = ranges.element_model(("test", "reversed"), False, effect_of,
                                 _runner(reversed_uniform), torch.float32, torch.device("cpu"))
    assert model is None


def test_a_call_with_a_seed_word_is_not_sliced():
    """``b != 0`` in ``words = a * n + b``: a seed drawn first (MKL's bernoulli path)."""

    def effect_of(n):
        return draws.Effect(words=n + 1)

    def run(out, state):
        return state

    assert ranges.element_model(("test", "seeded"), False, effect_of, run, torch.float32,
                                torch.device("cpu")) is None
