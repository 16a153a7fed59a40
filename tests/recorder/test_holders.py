"""Graph.holders: the deferred tensor over a storage, for ops handed a bare storage."""

from __future__ import annotations

import gc

import torch

from parity import check_program
from torchdefer.recorder._graph import Holders


class _Tensorish:
    pass


def test_holders_answer_the_latest_live_tensor_and_none_once_it_died():
    holders = Holders()
    a, b = _Tensorish(), _Tensorish()
    holders[1] = a
    holders[1] = b
    assert holders.get(1) is b and holders.get(2) is None
    del b
    gc.collect()
    assert holders.get(1) is None


def test_holders_sweep_dead_entries_as_they_grow():
    holders = Holders()
    keep = []
    for i in range(5000):
        t = _Tensorish()
        holders[i] = t
        if i % 10 == 0:
            keep.append(t)
    del t
    assert len(holders._refs) < 2048 + 1024  # swept, not 5000
    assert len(holders) == len(keep)
    assert all(holders.get(i * 10) is t for i, t in enumerate(keep))


def test_set_to_a_storage_made_in_cpp_finds_its_deferred_owner():
    def program(defer):
        def build():
            y = torch.empty(3, 4).normal_()
            x = torch.empty(0)
            x.set_(y, 2, (2, 3), (3, 1))
            return x, y

        return defer(build)

    check_program(program)


def test_many_recorded_storages_keep_set_working_after_sweeps():
    def program(defer):
        def build():
            for _ in range(3000):
                torch.empty(2)  # dead at once: swept from the holders
            y = torch.empty(6).uniform_()
            x = torch.empty(0).set_(y, 1, (4,), (1,))
            return x, y

        return defer(build)

    check_program(program)
