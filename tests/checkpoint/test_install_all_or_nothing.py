"""The install step is all or nothing too: swaps checked before the first, replays of
missing tensors done before it, and a swap failing anyway undone.

Failures are injected at each position of the install (the Nth swap, the
replay of a missing tensor, the rebuild of a missing view of a loaded tensor);
each time every tensor is checked as it was (object, class, deferred-ness,
bits), and a following good load gives eager's module.
"""

from __future__ import annotations

import pytest
import torch
from _crafted import assert_unchanged, snapshot
from torch import nn

import torchdefer
import torchdefer.checkpoint._install as install_module
from parity import assert_same_module
from torchdefer.errors import TorchdeferError
from torchdefer.materialize import SwapError

EXTERNAL = {"t": torch.ones(8)}  # read at construction; one test changes it: a replay fails


class WithMissing(nn.Module):
    """Loaded parameters, a missing buffer computed from an external tensor, a missing
    head, and a missing view of a loaded parameter (non-persistent)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 3)  # not in the checkpoint: a new head
        self.register_buffer("scale", EXTERNAL["t"] * 2)  # missing, replayed from EXTERNAL
        self.register_buffer("row", self.body.weight.detach()[0], persistent=False)


def _state(seed: int = 1) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    state = WithMissing().state_dict()
    return {k: v for k, v in state.items() if not k.startswith("head.") and k != "scale"}


def _deferred() -> nn.Module:
    torch.manual_seed(0)
    return torchdefer.deferred_init(WithMissing)


def _expected(state) -> nn.Module:
    torch.manual_seed(0)
    eager = WithMissing()
    eager.load_state_dict(state, strict=False)
    return eager


def test_a_load_with_missing_tensors_and_views_matches_eager():
    model, state = _deferred(), _state()
    result = torchdefer.load_state_dict(model, state)
    assert set(result.missing_keys) == {"head.weight", "head.bias", "scale"}
    eager = _expected(state)
    assert_same_module(model, eager)
    assert model.row.untyped_storage().data_ptr() == model.body.weight.untyped_storage().data_ptr()


def _count_swaps() -> int:
    calls = []
    original = install_module.exchange

    def counting(*args):
        calls.append(args[2])
        return original(*args)

    install_module.exchange = counting
    try:
        torchdefer.load_state_dict(_deferred(), _state())
    finally:
        install_module.exchange = original
    return len(calls)


SWAPS = _count_swaps()


@pytest.mark.parametrize("failing", range(SWAPS))
def test_a_swap_failing_at_any_position_undoes_the_others(monkeypatch, failing):
    """A refusal the pre-check cannot see (injected at the Nth exchange, the view's
    included) leaves every tensor as it was; a good load follows."""
    model = _deferred()
    before = snapshot(model)
    original, seen = install_module.exchange, []

    def fails_at_n(fake, shell, path):
        seen.append(path)
        if len(seen) == failing + 1:
            raise SwapError(f"injected at '{path}'")
        return original(fake, shell, path)

    monkeypatch.setattr(install_module, "exchange", fails_at_n)
    with pytest.raises(SwapError, match="injected"):
        torchdefer.load_state_dict(model, _state())
    monkeypatch.setattr(install_module, "exchange", original)
    assert_unchanged(model, before)
    other = _state(seed=2)  # other values: nothing of the failed load may show through
    torchdefer.load_state_dict(model, other)
    assert_same_module(model, _expected(other))


def test_a_cpp_weak_reference_is_found_before_the_first_swap():
    """PyTorch's own refusal (a C++ weak reference to a TensorImpl) on the last tensor
    is seen by the pre-check: nothing was swapped; dropped, the load works."""
    model = _deferred()
    names = list(dict(model.named_parameters()))
    holder = torch._C._WeakTensorRef(model.head.bias)  # replayed last: the last swap
    before = snapshot(model)
    with pytest.raises(SwapError, match=r"'head\.bias'.*weak reference"):
        torchdefer.load_state_dict(model, _state())
    assert_unchanged(model, before)
    assert names == list(dict(model.named_parameters()))
    del holder
    torchdefer.load_state_dict(model, _state())
    assert_same_module(model, _expected(_state()))


def test_a_replay_failing_for_a_missing_tensor_changes_nothing(monkeypatch):
    """The missing buffer's recorded input was changed after recording: its replay
    refuses, before any loaded tensor is installed; a load that has it works."""
    monkeypatch.setitem(EXTERNAL, "t", torch.ones(8))  # a fresh one, changed only here
    model = _deferred()
    before = snapshot(model)
    EXTERNAL["t"].add_(1)
    with pytest.raises(TorchdeferError, match="modified in place"):
        torchdefer.load_state_dict(model, _state())
    assert_unchanged(model, before)
    EXTERNAL["t"].sub_(1)  # same values, but its version moved: still refused
    full = dict(_state(), scale=torch.full((8,), 2.0))
    torchdefer.load_state_dict(model, full)
    assert_same_module(model, _expected(full))


def test_an_injected_replay_failure_of_the_last_missing_tensor_changes_nothing(monkeypatch):
    import torchdefer.materialize._api as api

    model = _deferred()
    before = snapshot(model)
    original, seen = api._replay, []

    def fails_last(fake, device, name):
        seen.append(name)
        if name == "head.bias":
            raise RuntimeError("injected replay failure")
        return original(fake, device, name)

    monkeypatch.setattr(api, "_replay", fails_last)
    with pytest.raises(RuntimeError, match="injected"):
        torchdefer.load_state_dict(model, _state())
    assert "head.weight" in seen  # others were replayed before it, and dropped
    monkeypatch.setattr(api, "_replay", original)
    assert_unchanged(model, before)
    torchdefer.load_state_dict(model, _state())
    assert_same_module(model, _expected(_state()))


def test_a_copy_into_an_expanded_real_tensor_is_refused_before_anything_changes():
    model = _deferred()
    torchdefer.materialize_module(model)
    model.norm.weight = nn.Parameter(torch.ones(1).expand(8))
    before = snapshot(model)
    with pytest.raises(torchdefer.checkpoint.CheckpointUsageError, match="norm.weight"):
        torchdefer.load_state_dict(model, _state())
    assert_unchanged(model, before)
