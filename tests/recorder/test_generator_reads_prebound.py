"""A generator read through a method taken *before* ``deferred_init`` began gives eager's state.

A bound method (``get = g.get_state``) holds the C method table entry and
calls its function directly, so replacing the method in the type's dict does
not reach it; ``_compat.method_table`` redirects the entry itself while a
recording runs. Each test binds the read before the recording, calls it
inside, keeps the state and uses it after: the numbers then drawn must be
eager's (``parity.check_program`` compares bit for bit).
"""

from __future__ import annotations

import copy
import functools
import threading

import pytest
import torch
from torch import nn

import torchdefer
from parity import check_program as check
from torchdefer._compat import generator as compat_generator
from torchdefer._compat import method_table

_HAS_CLONE = "clone_state" in compat_generator.STATE_READS


def _state(taken):
    """What a taken read gives, as a state tensor (``clone_state`` gives a generator)."""
    return taken.get_state() if isinstance(taken, torch.Generator) else taken


_BINDERS = {
    "bound get_state": lambda g: g.get_state,
    "unbound descriptor": lambda g: functools.partial(torch.Generator.__dict__["get_state"], g),
    "partial": lambda g: functools.partial(g.get_state),
    "bound clone_state": lambda g: g.clone_state,
    "bound __reduce__": lambda g: lambda r=g.__reduce__: r()[2][-1],
    "copy.copy partial": lambda g: functools.partial(copy.copy, g),
}


@pytest.mark.parametrize("name", sorted(_BINDERS))
@pytest.mark.parametrize("own", [False, True], ids=["default", "user"])
def test_a_read_bound_before_the_recording_gives_the_exact_state(name, own):
    if "clone_state" in name and not _HAS_CLONE:
        pytest.skip("this torch has no Generator.clone_state")

    def program(defer):
        g = torch.Generator().manual_seed(41) if own else torch.default_generator
        read = _BINDERS[name](g)  # taken before deferred_init begins
        box = {}

        def build():
            a = torch.randn(19, generator=g)
            box["state"] = _state(read())
            return a, nn.Linear(3, 2), torch.rand(5, generator=g)

        out = defer(build)
        torch.randn(4, generator=g)
        g.set_state(box["state"])
        return out, torch.randn(6, generator=g), box["state"], g

    check(program)


def test_torch_get_rng_state_taken_before_gives_the_exact_state():
    def program(defer):
        read, write = torch.get_rng_state, torch.random.set_rng_state
        box = {}

        def build():
            a = torch.randn(13)
            box["state"] = read()
            return a, torch.randn(2)

        out = defer(build)
        write(box["state"])
        return out, torch.randn(7), box["state"]

    check(program)


def test_a_read_bound_before_in_nested_recordings_gives_exact_states():
    def program(defer):
        read = torch.default_generator.get_state
        box = {}

        def inner():
            x = torch.randn(9)
            box["inner"] = read()
            return x

        def outer():
            a = torch.randn(4)
            b = defer(inner)
            box["outer"] = read()
            return a, b, torch.rand(3)

        out = defer(outer)
        torch.set_rng_state(box["inner"])
        c = torch.randn(5)
        torch.set_rng_state(box["outer"])
        return out, c, torch.randn(5)

    check(program)


def test_a_read_bound_in_another_thread_gives_the_exact_state():
    def program(defer):
        got = []
        worker = threading.Thread(target=lambda: got.append(torch.default_generator.get_state))
        worker.start()
        worker.join()
        box = {}

        def build():
            a = torch.randn(15)
            box["state"] = got[0]()
            return a, torch.randn(3)

        out = defer(build)
        torch.set_rng_state(box["state"])
        return out, torch.randn(8)

    check(program)


def test_a_read_bound_before_beside_fake_cuda_draws_gives_the_cpu_state():
    """CUDA draws never move the CPU generator: the CPU state read is eager's CPU-only one."""
    read = torch.default_generator.get_state

    def build(cuda):
        out = [torch.randn(11)]
        if cuda:
            out.append(torch.randn(6, device="cuda"))
        state = read()
        return out, state, torch.rand(4)

    torch.manual_seed(3)
    eager_out, eager_state, eager_after = build(cuda=False)
    torch.manual_seed(3)
    out, state, after = torchdefer.deferred_init(build, True)
    assert torch.equal(state, eager_state)
    assert torch.equal(torchdefer.materialize_tensor(after), eager_after)
    assert torch.equal(torchdefer.materialize_tensor(out[0]), eager_out[0])


def test_the_table_entries_are_put_back_when_the_recording_ends():
    assert compat_generator.reads_intercepted()
    read = torch.default_generator.get_state

    def build():
        torch.randn(3)
        assert all(dunder in torch.Generator.__dict__ for dunder in method_table.SLOT_DUNDERS[:1])
        raise KeyError("the constructor fails")

    with pytest.raises(KeyError):
        torchdefer.deferred_init(build)
    assert not any(r.installed() for r in compat_generator._redirects.values())
    assert not any(d in torch.Generator.__dict__ for d in (*method_table.SLOT_DUNDERS,
                                                           "__deepcopy__"))
    assert torch.equal(read(), torch.get_rng_state())


def test_an_error_of_the_hook_reaches_the_caller_of_a_bound_method():
    assert compat_generator.reads_intercepted()
    read = torch.Generator().get_state

    def refuse(generator):
        raise LookupError("from the hook")

    assert compat_generator.intercept_reads(refuse)
    try:
        with pytest.raises(LookupError, match="from the hook"):
            read()
    finally:
        compat_generator.restore_reads()
    assert read().dtype == torch.uint8


def test_a_redirect_refuses_what_is_not_a_no_argument_c_method():
    with pytest.raises(RuntimeError, match="not a METH_NOARGS"):
        method_table.Redirect(torch._C.Generator, "manual_seed", "__neg__")
    with pytest.raises(RuntimeError, match="not a C method"):
        method_table.Redirect(torch._C.Generator, "device", "__neg__")
