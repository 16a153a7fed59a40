"""``rng._ledger.RngLedger.try_place_plain``: the common random op placed in one step, and every way out of it.

Each program mixes plain ``normal_``/``uniform_`` calls (the one-step case)
with what must send a call back to the general placement: a reseed, a
restored state, a read of the state, a random op of another kind, other
dtypes and strides, inference mode, another thread. Eager and deferred must
agree bit for bit, in any order, and leave the generator where eager leaves
it; the spy checks that the one-step case was taken where it applies.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

from parity import check_program
from torchdefer.rng import _ledger as ledger


@pytest.fixture
def taken(monkeypatch):
    """How many calls ``try_place_plain`` placed (True) and sent back (False)."""
    counts = {True: 0, False: 0}
    original = ledger.RngLedger.try_place_plain

    def spy(self, call, device, key):
        done = original(self, call, device, key)
        counts[done] += 1
        return done

    monkeypatch.setattr(ledger.RngLedger, "try_place_plain", spy)
    return counts


def _plain_run():
    out = []
    for n in (3, 16, 17, 33):
        w = torch.empty(n, 5)
        w.normal_(0, 0.02)
        w.uniform_(-0.1, 0.1)
        w.normal_()  # default arguments: another key
        out.append(w)
    return out


def _alone() -> bool:
    """Whether markers may stand (recorder._rng_placement._lazy): no other Python thread, such as
    the draw threads an earlier test's threaded materialization keeps."""
    return threading.active_count() == 1


def test_plain_calls_are_placed_in_one_step_and_replay_as_eager(taken):
    check_program(lambda defer: defer(_plain_run))
    assert taken[True] >= 10 or not _alone()


def _reseeds_and_restores():
    a = torch.empty(7, 3).normal_()
    torch.manual_seed(5)  # a new epoch: the marker is gone
    b = torch.empty(7, 3).normal_()
    state = torch.get_rng_state()  # a read: the exact state is put in
    c = torch.empty(4, 4).uniform_()
    torch.set_rng_state(state)  # a restore of that state
    d = torch.empty(4, 4).uniform_()
    e = torch.empty(9).normal_(1.0, 2.0)
    with torch.random.fork_rng():
        f = torch.empty(9).normal_()
    g = torch.empty(9).normal_()
    return [a, b, c, d, e, f, g]


@pytest.mark.parametrize("order", [None, [6, 5, 4, 3, 2, 1, 0], [3, 0, 6]])
def test_reseeds_reads_and_restores_between_plain_calls(taken, order):
    check_program(lambda defer: defer(_reseeds_and_restores), order=order)
    assert (taken[True] and taken[False]) or not _alone()


def _mixed_kinds():
    a = torch.empty(6, 6).normal_()
    b = torch.randn(5)  # a random factory: the general path
    c = torch.empty(6, 6).normal_()
    d = torch.empty(6, 6).bernoulli_(0.3)
    e = torch.empty(8, 4, dtype=torch.float64).normal_()  # another draw model
    f = torch.empty(8, 4, dtype=torch.float16).uniform_()
    g = torch.empty(8, 4, dtype=torch.bfloat16).normal_()
    h = torch.empty(4, 8).t().normal_()  # strided: its own key
    i = torch.empty(5, 5).normal_()
    return [a, b, c, d, e, f, g, h, i]


def test_other_random_ops_dtypes_and_strides_between_plain_calls(taken):
    check_program(lambda defer: defer(_mixed_kinds))
    check_program(lambda defer: defer(_mixed_kinds), order=list(range(8, -1, -1)))
    assert taken[True] or not _alone()


def _inference_and_threads():
    a = torch.empty(6).normal_()
    with torch.inference_mode():
        b = torch.empty(6).normal_()
    result = []
    thread = threading.Thread(target=lambda: result.append(1))
    thread.start()
    thread.join()
    c = torch.empty(6).normal_()
    return [a, b, c]


def test_inference_mode_and_a_thread_between_plain_calls(taken):
    check_program(lambda defer: defer(_inference_and_threads))


def _after_threaded_materialization():
    return [torch.empty(64, 32).normal_(), torch.empty(64, 32).uniform_()]


_FRESH = "TORCHDEFER_TEST_FRESH_PROCESS"


def test_markers_stand_again_after_a_threaded_materialization_keeps_its_threads(taken):
    import torchdefer
    from torchdefer.rng import kept_threads

    if threading.active_count() > 1 + kept_threads() and not os.environ.get(_FRESH):
        # Threads of earlier tests (a progress bar's monitor, a pool) are alive:
        # the case needs a process where torchdefer's are the only ones.
        test = f"{__file__}::{sys._getframe().f_code.co_name}"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
            env={**os.environ, _FRESH: "1"}, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return
    big = torchdefer.deferred_init(lambda: torch.empty(1 << 22).normal_())
    torchdefer.materialize_tensor(big, threads=2)  # split: its draw threads are kept
    assert threading.active_count() - 1 == kept_threads() >= 1
    check_program(lambda defer: defer(_after_threaded_materialization))
    assert taken[True] >= 1  # not every op moved the generator at once (a jump each)


def test_a_user_thread_alive_still_moves_the_generator_at_once(taken):
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        check_program(lambda defer: defer(_plain_run))
    finally:
        stop.set()
        worker.join()
    assert taken[True] == 0
