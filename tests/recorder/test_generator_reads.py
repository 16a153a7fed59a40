"""Every way user code reads a generator's state inside ``deferred_init`` gives eager's state.

While recording, a CPU generator may hold a *marker* (a cheap stand-in for
the logical position). Each test reads the state inside the constructor in
one of the ways torch offers, keeps it past ``deferred_init`` and uses it
after: the numbers drawn then must be eager's (``parity.check_program``
compares every returned tensor and generator bit for bit).
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import torchdefer
from parity import check_program as check
from torchdefer._compat import generator as compat_generator


def _read_default_state(read):
    """A program: draws, ``read()`` of the default generator inside, restored after."""

    def program(defer):
        box = {}

        def build():
            a = torch.randn(17)
            box["state"] = read()
            return a, nn.Linear(5, 3)

        out = defer(build)
        torch.randn(9)  # move on, then go back
        torch.default_generator.set_state(box["state"])
        return out, torch.randn(6), box["state"]

    return program


@pytest.mark.parametrize(
    "read",
    [
        lambda: torch.default_generator.get_state(),
        lambda: torch.Generator.get_state(torch.default_generator),
        lambda: torch.get_rng_state(),
        lambda: torch.random.get_rng_state(),
    ],
    ids=["method", "unbound", "get_rng_state", "random.get_rng_state"],
)
def test_a_default_state_read_inside_and_restored_after_draws_eager_numbers(read):
    check(_read_default_state(read))


def _read_user_generator(copy_of, thaw=lambda kept: kept):
    """A program: a user generator copied inside the constructor, drawn from after."""

    def program(defer):
        g = torch.Generator().manual_seed(31)
        box = {}

        def build():
            a = torch.rand(23, generator=g)
            box["copy"] = copy_of(g)
            return a, torch.randn(4, generator=g)

        out = defer(build)
        kept = thaw(box["copy"])
        return out, g, kept, torch.randn(7, generator=kept)

    return program


def _restored(g):
    state = g.get_state()
    fresh = torch.Generator()
    fresh.set_state(state)
    return fresh


@pytest.mark.parametrize(
    "copy_of",
    [_restored, copy.deepcopy, copy.copy, lambda g: g.clone_state()],
    ids=["get_state", "deepcopy", "copy", "clone_state"],
)
def test_a_user_generator_copied_inside_draws_eager_numbers_after(copy_of):
    if copy_of is not _restored and not hasattr(torch.Generator, "clone_state"):
        pytest.skip("this torch has no Generator.clone_state")
    check(_read_user_generator(copy_of))


def test_a_user_generator_pickled_inside_and_loaded_after_draws_eager_numbers():
    # Loading inside would build real tensors under the recording (refused, loudly).
    check(_read_user_generator(pickle.dumps, pickle.loads))
    check(_read_user_generator(lambda g: torch.save(g, buffer := io.BytesIO()) or buffer,
                               lambda b: torch.load(io.BytesIO(b.getvalue()),
                                                    weights_only=False)))


def test_a_state_read_inside_and_restored_inside_is_known_as_its_position():
    def build():
        a = torch.randn(30)
        saved = torch.default_generator.get_state()
        b = torch.rand(11)
        torch.default_generator.set_state(saved)
        c = torch.rand(11)  # eager: equal to b
        return a, b, c, torch.randn(3)

    check(lambda defer: defer(build), order=[3, 2, 1, 0])


def test_a_generator_read_without_having_drawn_is_read_as_it_is():
    def program(defer):
        g = torch.Generator().manual_seed(8)
        box = {}

        def build():
            box["g"] = g.get_state()
            return torch.randn(5)

        out = defer(build)
        g.set_state(box["g"])
        return out, torch.randn(2, generator=g)

    check(program)


def test_fork_rng_and_a_direct_read_inside_give_eager_numbers():
    def program(defer):
        box = {}

        def build():
            a = torch.randn(12)
            with torch.random.fork_rng(devices=[]):
                box["inner"] = torch.default_generator.get_state()
                b = torch.rand(5)
            box["outer"] = torch.default_generator.get_state()
            return a, b, torch.randn(3)

        out = defer(build)
        torch.default_generator.set_state(box["inner"])
        c = torch.rand(5)
        torch.default_generator.set_state(box["outer"])
        return out, c, torch.randn(3)

    check(program)


def test_states_read_in_nested_deferred_inits_are_eager_states():
    def program(defer):
        box = {}

        def inner():
            x = torch.randn(7)
            box["inner"] = torch.get_rng_state()
            return x

        def outer():
            a = torch.randn(5)
            b = defer(inner)
            box["outer"] = torch.default_generator.get_state()
            return a, b

        out = defer(outer)
        torch.set_rng_state(box["inner"])
        c = torch.randn(4)
        torch.set_rng_state(box["outer"])
        return out, c, torch.randn(4)

    check(program)


def test_a_read_with_another_thread_alive_gives_eager_numbers():
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        check(_read_default_state(lambda: torch.default_generator.get_state()))
        check(_read_user_generator(copy.deepcopy))
    finally:
        stop.set()
        other.join()


def test_without_intercepted_reads_no_marker_is_left_and_values_stay_eager(monkeypatch):
    monkeypatch.setattr(compat_generator, "intercept_reads", lambda before: False)
    seen = []

    def build():
        a = torch.randn(40)
        seen.append(torch.Generator.get_state(torch.default_generator))
        return a, nn.Linear(4, 4)

    check(_read_default_state(lambda: torch.default_generator.get_state()))
    check(_read_user_generator(lambda g: g.clone_state()))
    torch.manual_seed(2)
    eager_a = torch.randn(40)
    eager_state = torch.get_rng_state()
    torch.manual_seed(2)
    torchdefer.deferred_init(build)
    assert torch.equal(seen[0], eager_state)  # the exact state, no marker, at every op
    del eager_a


def test_the_generator_methods_are_put_back_when_recording_ends():
    before = {name: torch.Generator.__dict__.get(name) for name in ("get_state", "__reduce__",
                                                                     "__deepcopy__")}

    def build():
        assert "__deepcopy__" in torch.Generator.__dict__  # the redirects are in
        torch.randn(3)
        raise KeyError("the constructor fails")

    assert compat_generator.reads_intercepted()
    with pytest.raises(KeyError):
        torchdefer.deferred_init(build)
    after = {name: torch.Generator.__dict__.get(name) for name in before}
    assert after == before
    assert torch.Generator().get_state().dtype == torch.uint8


def test_other_threads_reading_during_a_recording_see_the_original_method():
    got = []

    def build():
        a = torch.randn(10)
        worker = threading.Thread(target=lambda: got.append(torch.get_rng_state()))
        worker.start()  # a thread start puts the exact state in the generator first
        worker.join()
        return a

    check(lambda defer: defer(build))
    assert len(got) == 2 and torch.equal(got[0], got[1])  # eager's, then the deferred run's


def test_graphsafe_get_state_on_a_cpu_generator_fails_as_in_eager():
    if "graphsafe_get_state" not in compat_generator.STATE_READS:
        pytest.skip("this torch has no Generator.graphsafe_get_state")
    with pytest.raises(Exception) as eager:
        torch.default_generator.graphsafe_get_state()

    def build():
        torch.randn(3)
        with pytest.raises(type(eager.value)):
            torch.default_generator.graphsafe_get_state()
        return torch.randn(2)

    check(lambda defer: defer(build))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_process_forked_inside_the_constructor_inherits_the_exact_state():
    def program(defer):
        box = {}

        def build():
            a = torch.randn(21)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: the state it inherited, read without any hook
                state = compat_generator.get_state(torch.default_generator)
                os.write(write, bytes(state.tolist()))
                os._exit(0)
            os.close(write)
            with os.fdopen(read, "rb") as pipe:
                box["child"] = pipe.read()
            os.waitpid(pid, 0)
            return a

        out = defer(build)
        return out, torch.tensor(list(box["child"]), dtype=torch.uint8)

    check(program)


_READS = {
    "get_state": lambda g: g.get_state(),
    "clone_state": lambda g: g.clone_state().get_state(),
    "copy": lambda g: copy.copy(g).get_state(),
    "deepcopy": lambda g: copy.deepcopy(g).get_state(),
}  # pickle.loads of a tensor inside deferred_init is refused (it builds a real tensor)
_STEP = st.one_of(
    st.tuples(st.just("draw"), st.sampled_from(["randn", "rand", "normal_16"]),
              st.integers(1, 40), st.booleans()),
    st.tuples(st.just("read"), st.sampled_from(sorted(_READS)), st.booleans()),
    st.tuples(st.just("restore"), st.integers(0, 5), st.booleans()),
)


def _run_steps(steps, g, kept, out):
    for step in steps:
        kind, *rest = step
        if kind == "draw":
            how, n, own = rest
            generator = g if own else None
            if how == "randn":
                out.append(torch.randn(n, generator=generator))
            elif how == "rand":
                out.append(torch.rand(n, generator=generator))
            else:  # the Box-Muller path and, under 16, the cached normal
                out.append(torch.empty(n + 15).normal_(generator=generator))
        elif kind == "read":
            name, own = rest
            kept.append((own, _READS[name](g if own else torch.default_generator)))
        elif kept:
            index, _ = rest
            own, state = kept[index % len(kept)]
            (g if own else torch.default_generator).set_state(state)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inside=st.lists(_STEP, max_size=8), after=st.lists(_STEP, max_size=5))
def test_any_reads_and_restores_inside_and_after_give_eager_numbers(inside, after):
    if not hasattr(torch.Generator, "clone_state"):
        inside = [s for s in inside if s[:2] != ("read", "clone_state")]
        after = [s for s in after if s[:2] != ("read", "clone_state")]

    def program(defer):
        g = torch.Generator().manual_seed(77)
        kept: list = []

        def build():
            out: list = []
            _run_steps(inside, g, kept, out)
            return out

        built = defer(build)
        later: list = []
        _run_steps(after, g, kept, later)
        return built, later, g, torch.randn(3), torch.rand(2, generator=g)

    check(program)
