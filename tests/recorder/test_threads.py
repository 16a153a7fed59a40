"""A recording in one thread changes nothing another thread can see.

Each program is sequenced with events so that its eager run is
deterministic; run once eagerly and once with one thread recording, every
thread must get the same numbers and the generator must end in the same
place.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module


def eager(fn: Callable[[], Any]) -> Any:
    return fn()


def _run(defer, other: Callable[[], Any], build_before, build_after, start_inside=False):
    """``build_before``; ``other()`` runs in a thread; then ``build_after``: eager or deferred."""
    torch.manual_seed(0)
    go, done = threading.Event(), threading.Event()
    got: dict[str, Any] = {}

    def thread_body():
        go.wait()
        got["other"] = other()
        done.set()

    thread = threading.Thread(target=thread_body)
    if not start_inside:
        thread.start()

    def build():
        first = build_before()
        if start_inside:
            thread.start()
        go.set()
        done.wait()
        return first, build_after()

    built = defer(build)
    thread.join()
    after = torch.rand(4)
    if defer is not eager:
        for part in built:
            if isinstance(part, nn.Module):
                torchdefer.materialize_module(part)
            else:
                part = torchdefer.materialize_tensor(part)
    return got["other"], built, after


def _compare(other, build_before, build_after, start_inside=False):
    ref = _run(eager, other, build_before, build_after, start_inside)
    got = _run(torchdefer.deferred_init, other, build_before, build_after, start_inside)
    assert torch.equal(got[0], ref[0]), "the other thread's numbers"
    for a, b in zip(got[1], ref[1]):
        if isinstance(b, nn.Module):
            assert_same_module(a, b)
        else:
            assert torch.equal(torchdefer.materialize_tensor(a), b)
    assert torch.equal(got[2], ref[2]), "where the generator ends"


def test_a_thread_drawing_between_two_recorded_ops_gets_eagers_numbers():
    _compare(lambda: torch.rand(5), lambda: nn.Linear(4, 4), lambda: nn.Linear(4, 4))


def test_a_thread_started_by_the_recording_thread_gets_eagers_numbers():
    _compare(lambda: torch.randn(5), lambda: torch.randn(7), lambda: torch.randn(3),
             start_inside=True)


def test_a_thread_building_a_model_eagerly_while_another_records_gets_eagers_model():
    def other():
        torch.manual_seed(1)  # the other thread's own program
        layer = nn.Linear(3, 3)
        nn.init.trunc_normal_(layer.weight, std=0.02)
        return torch.cat([layer.weight.detach().flatten(), torch.rand(2)])

    _compare(other, lambda: torch.randn(4), lambda: nn.Linear(2, 2))


def test_a_thread_drawing_with_its_own_generator_is_unaffected():
    def other():
        g = torch.Generator().manual_seed(5)
        return torch.rand(6, generator=g)

    _compare(other, lambda: torch.randn(4), lambda: torch.randn(4))


def test_another_threads_set_default_dtype_survives_the_recording():
    previous = torch.get_default_dtype()
    go, done = threading.Event(), threading.Event()

    def other():
        go.wait()
        torch.set_default_dtype(torch.float64)
        done.set()

    def build():
        go.set()
        done.wait()
        return torch.ones(2)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        t = torchdefer.deferred_init(build)
        thread.join()
        assert torch.get_default_dtype() == torch.float64  # as eager leaves it
        assert t.dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.filterwarnings("ignore:torch.set_default_tensor_type")
def test_the_recordings_own_set_default_dtype_is_restored_with_threads_alive():
    previous = torch.get_default_dtype()
    stop = threading.Event()
    idle = threading.Thread(target=stop.wait)
    idle.start()
    try:
        def build():
            torch.set_default_dtype(torch.float64)
            return torch.ones(2)

        t = torchdefer.deferred_init(build)
        assert t.dtype == torch.float64
        assert torch.get_default_dtype() == previous
        torch.set_default_tensor_type(torch.DoubleTensor)  # the legacy spelling too
        torch.set_default_dtype(previous)
        torchdefer.deferred_init(lambda: torch.set_default_tensor_type(torch.DoubleTensor))
        assert torch.get_default_dtype() == previous
    finally:
        stop.set()
        idle.join()
        torch.set_default_dtype(previous)


def test_a_later_change_by_another_thread_is_not_undone_by_the_block():
    previous = torch.get_default_dtype()
    go, done = threading.Event(), threading.Event()

    def other():
        go.wait()
        torch.set_default_dtype(torch.float16)
        done.set()

    def build():
        torch.set_default_dtype(torch.float64)
        go.set()
        done.wait()

    thread = threading.Thread(target=other)
    thread.start()
    try:
        torchdefer.deferred_init(build)
        thread.join()
        assert torch.get_default_dtype() == torch.float16
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize("order", ["first_in_first_out", "first_in_last_out"])
def test_two_threads_recording_at_once_leave_no_patch_behind(order):
    originals = (torch.get_rng_state, torch.random.get_rng_state, threading.Thread.start,
                 torch.set_default_dtype, torch.set_default_tensor_type,
                 torch.Tensor._make_subclass, torch.nn.init._no_grad_trunc_normal_)
    a_in, b_in, a_may_leave, b_left = (threading.Event() for _ in range(4))
    results: dict[str, Any] = {}

    def a_body():
        def build():
            a_in.set()
            b_in.wait()
            a_may_leave.wait()
            return nn.Linear(2, 2)
        results["a"] = torchdefer.deferred_init(build)

    def b_body():
        a_in.wait()

        def build():
            b_in.set()
            if order == "first_in_last_out":
                a_may_leave.set()
            return nn.Linear(2, 2)
        results["b"] = torchdefer.deferred_init(build)
        b_left.set()
        a_may_leave.set()

    threads = [threading.Thread(target=a_body), threading.Thread(target=b_body)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (torch.get_rng_state, torch.random.get_rng_state, threading.Thread.start,
            torch.set_default_dtype, torch.set_default_tensor_type,
            torch.Tensor._make_subclass, torch.nn.init._no_grad_trunc_normal_) == originals
    for model in results.values():
        torchdefer.materialize_module(model)
        assert not torchdefer.is_deferred(model)
