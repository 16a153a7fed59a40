"""Generators end where eager code leaves them, whatever the constructor does with them.

Each test runs one program twice from the same seed: once with ``defer``
calling the constructor eagerly, once with ``torchdefer.deferred_init``. Every
tensor the program returns, and every generator's state afterwards, must be
bitwise equal.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_tensor
from parity import check_program as check


def test_reseeding_to_the_seed_already_in_force_repeats_the_draws():
    def build():
        torch.manual_seed(0)
        a = torch.randn(3)
        torch.manual_seed(0)
        return a, torch.randn(3)

    check(lambda defer: defer(build))


def test_reseeding_a_user_generator_to_its_own_seed_repeats_the_draws():
    def build():
        g = torch.Generator().manual_seed(4)
        a = torch.rand(5, generator=g)
        g.manual_seed(4)
        return a, torch.rand(5, generator=g), g

    check(lambda defer: defer(build))


def test_restoring_a_state_read_with_get_rng_state_replays_the_same_numbers():
    def build():
        saved = torch.get_rng_state()
        a = torch.randn(20)
        torch.set_rng_state(saved)
        return a, torch.randn(20)

    check(lambda defer: defer(build))


def test_restoring_a_state_read_directly_from_the_generator_is_recognised():
    def build():
        first = torch.randn(17)  # recorded: the generator now holds a marker
        saved = torch.default_generator.get_state()
        a = torch.randn(33)
        torch.default_generator.set_state(saved)
        return first, a, torch.randn(33)

    check(lambda defer: defer(build))


def test_fork_rng_around_recorded_draws_restores_the_stream():
    def build():
        a = torch.randn(4)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(99)
            b = torch.rand(6)
        return a, b, torch.randn(4)

    check(lambda defer: defer(build))


def test_two_and_three_deferred_inits_in_a_row_then_eager_draws_match_eager():
    def program(defer):
        models = [defer(nn.Linear, 8, 8), defer(nn.Linear, 16, 4), defer(nn.Embedding, 10, 3)]
        return models, torch.randn(5), torch.rand(3)

    check(program)


def test_eager_draws_and_recorded_draws_after_deferred_init_interleave_as_in_eager():
    def program(defer):
        m = defer(nn.Linear, 20, 20)
        x = torch.randn(7)
        nn.init.normal_(m.weight)  # recorded outside deferred_init
        y = torch.rand(2)
        nn.init.uniform_(m.bias)
        return m, x, y, torch.randn(2)

    check(program)


def test_cached_normal_samples_carry_across_recorded_and_eager_draws():
    def build():
        a = torch.randn(3)  # odd count below 16: a normal sample stays cached
        b = torch.randn(5, 4).t().contiguous()  # 20 contiguous: the Box-Muller fill path
        c = torch.randn(4, 5).t()  # strided: cached normals again
        d = torch.empty(7).log_normal_()
        return a, b, c, d

    def program(defer):
        x = torch.randn(1)  # leaves a cached sample for the constructor to use
        return x, defer(build), torch.randn(1), torch.randn(2)

    check(program)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_every_modeled_random_op_keeps_the_stream_in_step(dtype):
    def build():
        g = torch.Generator().manual_seed(11)
        out = [
            torch.empty(37, dtype=dtype).normal_(),
            torch.empty(37, dtype=dtype).uniform_(-2, 2, generator=g),
            torch.empty(5, 9, dtype=dtype).t().bernoulli_(0.25),
            torch.bernoulli(torch.full((9,), 0.5, dtype=dtype)),
            torch.empty(13, dtype=dtype).exponential_(generator=g),
            torch.empty(13, dtype=dtype).geometric_(0.3),
            torch.empty(13, dtype=dtype).cauchy_(generator=g),
            torch.randint(0, 1 << 40, (6,)),
            torch.randint(3, 9, (11,), generator=g),
            torch.empty(8, dtype=torch.int32).random_(),
            torch.empty(8, dtype=dtype).random_(0, 100),
            torch.randperm(31),
            torch.randn_like(torch.empty(6, 4, dtype=dtype).t()),
            torch.rand_like(torch.empty(33, dtype=dtype)),
            torch.nn.functional.dropout(torch.ones(40, dtype=dtype), 0.3, training=True),
        ]
        return out, g

    check(lambda defer: defer(build))


def test_an_op_the_model_cannot_count_is_run_to_find_where_the_stream_continues():
    def build():
        probs = torch.rand(4, 6)
        picks = torch.multinomial(probs, 3, replacement=True)  # not modeled: runs
        return probs, picks, torch.randn(40)

    check(lambda defer: defer(build))


def test_materializing_in_reverse_and_in_part_gives_eager_values():
    def build():
        return nn.Sequential(*[nn.Linear(40, 40) for _ in range(6)])

    torch.manual_seed(0)
    ref = build()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    names = [n for n, _ in deferred.named_parameters()]
    lazy = dict(deferred.named_parameters())
    for name in reversed(names[len(names) // 2 :]):
        assert_same_tensor(torchdefer.materialize_tensor(lazy[name]), ref.get_parameter(name))
    torchdefer.materialize_module(deferred)
    for name in names:
        assert torch.equal(deferred.get_parameter(name), ref.get_parameter(name)), name


def test_materializing_never_moves_the_global_generator():
    torch.manual_seed(0)
    m = torchdefer.deferred_init(nn.Linear, 64, 64)
    before = torch.get_rng_state()
    torchdefer.materialize_module(m)
    assert torch.equal(torch.get_rng_state(), before)


def test_without_the_draw_model_every_position_is_reached_by_running_the_draws_before(
    monkeypatch,
):
    monkeypatch.setenv("TORCHDEFER_RNG_JUMPS", "0")

    def build():
        a = torch.randn(3)
        with torch.random.fork_rng(devices=[]):
            b = torch.rand(40)
        return a, b, nn.Linear(9, 9), torch.empty(5).bernoulli_(0.5)

    check(lambda defer: defer(build))


def test_a_marker_read_directly_then_restored_after_a_sync_is_resolved():
    def program(defer):
        g = torch.Generator().manual_seed(309)

        def build():
            a = torch.randint(3, (17,), dtype=torch.float32, generator=g)
            saved = g.get_state()  # a marker while recording: the read is not seen
            with torch.random.fork_rng(devices=[]):  # reads torch.get_rng_state: syncs
                torch.manual_seed(3)
                b = torch.rand(5)
            g.set_state(saved)
            return a, b

        return defer(build), g, torch.randn(5, generator=g)

    check(program)
