"""Loads into modules partly or wholly real: copies into real tensors are all or nothing too.

The model mixes deferred tensors (swapped in), real ones (copied into, some
converted from another dtype), a tied pair, buffers (an int64 one among them)
and parameters of a class whose ``copy_`` runs Python code (backed up). A
failure is injected at every position where the install can still fail (each
swap, each backed-up copy, each conversion); every tensor is then checked
against the state before the load (object, class, deferred-ness, storage,
bits), and a following good load must give eager's module.
"""

from __future__ import annotations

import signal

import pytest
import torch
from torch import nn

import torchdefer
import torchdefer.checkpoint._install as install_module
import torchdefer.checkpoint._load as load_module
from parity import assert_same_module
from torchdefer.checkpoint import CheckpointError, CheckpointUsageError
from torchdefer.materialize import SwapError


class Logged(nn.Parameter):
    """A parameter class with a ``__torch_function__`` of its own: its ``copy_`` runs Python."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.out = nn.Linear(4, 4)  # stays deferred: swapped in
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied


def _with_logged(model: nn.Module) -> nn.Module:
    model.bn.weight = Logged(model.bn.weight.detach().clone())
    model.body.bias = Logged(model.body.bias.detach().clone())
    return model


def _partly_real(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = torchdefer.deferred_init(Mixed)
    for sub in (model.embed, model.body, model.bn):
        torchdefer.materialize_module(sub)
    return _with_logged(model)


def _state(seed: int = 1) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    state = Mixed().state_dict()
    state["body.weight"] = state["body.weight"].double()  # converted: a fresh tensor
    state["bn.running_mean"] = state["bn.running_mean"] + 0.5
    return state


def _expected(state) -> nn.Module:
    torch.manual_seed(0)
    eager = _with_logged(Mixed())
    eager.load_state_dict(state)
    return eager


def _snapshot(module: nn.Module) -> dict:
    """Each name's object, class, deferred-ness, storage and (if real) bits."""
    out = {}
    for name, t in [*module.named_parameters(remove_duplicate=False),
                    *module.named_buffers(remove_duplicate=False)]:
        real = not torchdefer.is_deferred(t)
        storage = t.untyped_storage().data_ptr() if real else None
        bits = _bits(t).clone() if real else None
        out[name] = (id(t), type(t), real, storage, t.dtype, bits)
    return out


def _assert_unchanged(module: nn.Module, before: dict) -> None:
    after = _snapshot(module)
    assert after.keys() == before.keys()
    for name, was in before.items():
        now = after[name]
        assert now[:5] == was[:5], f"{name} changed object, class, deferred-ness or storage"
        if was[2]:
            assert torch.equal(now[5], was[5]), f"{name} changed values"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _calls(name: str) -> list[str]:
    """The paths ``install_module.<name>`` is called with in a good load."""
    seen, original = [], getattr(install_module, name)

    def counting(*args):
        seen.append(args)
        return original(*args)

    setattr(install_module, name, counting)
    try:
        torchdefer.load_state_dict(_partly_real(), _state())
    finally:
        setattr(install_module, name, original)
    return seen


def test_the_injection_points_cover_every_tensor():
    assert (SWAPS, COPIES, PREPARED) == (2, 8, 10)  # out.*; 6 plain + 2 Logged; both


def test_a_load_into_a_partly_real_module_matches_eager():
    model, state = _partly_real(), _state()
    weight = model.body.weight
    storage = weight.untyped_storage().data_ptr()
    result = torchdefer.load_state_dict(model, state)
    assert result.missing_keys == ()
    assert_same_module(model, _expected(state))
    assert model.body.weight is weight and weight.untyped_storage().data_ptr() == storage
    assert type(model.bn.weight) is Logged


SWAPS = len(_calls("exchange"))
COPIES = len(_calls("_copy"))
GUARDED = 2  # bn.weight and body.bias (Logged): copied with a backup, before the vote


def _fails_at(name: str, position: int, error: BaseException):
    original, seen = getattr(install_module, name), []

    def failing(*args):
        seen.append(args)
        if len(seen) == position + 1:
            raise error
        return original(*args)

    return failing


def _then_a_good_load_works(model: nn.Module) -> None:
    other = _state(seed=2)  # other values: nothing of the failed load may show through
    torchdefer.load_state_dict(model, other)
    assert_same_module(model, _expected(other))


@pytest.mark.parametrize("position", range(SWAPS))
def test_a_swap_failing_leaves_the_real_tensors_unchanged_too(monkeypatch, position):
    model = _partly_real()
    before = _snapshot(model)
    monkeypatch.setattr(install_module, "exchange",
                        _fails_at("exchange", position, SwapError("injected")))
    with pytest.raises(SwapError, match="injected"):
        torchdefer.load_state_dict(model, _state())
    monkeypatch.undo()
    _assert_unchanged(model, before)
    _then_a_good_load_works(model)


@pytest.mark.parametrize("position", range(GUARDED))
def test_a_copy_that_runs_code_failing_undoes_every_change(monkeypatch, position):
    """An OOM-like failure in the Nth copy into a tensor whose copy_ runs Python: the
    copies before it are restored from their backups, the swaps undone."""
    model = _partly_real()
    before = _snapshot(model)
    monkeypatch.setattr(install_module, "_copy",
                        _fails_at("_copy", position, MemoryError("injected out of memory")))
    with pytest.raises(MemoryError, match="injected"):
        torchdefer.load_state_dict(model, _state())
    monkeypatch.undo()
    _assert_unchanged(model, before)
    _then_a_good_load_works(model)


def _count_prepared() -> int:
    seen, original = [], load_module.prepare

    def counting(*args):
        seen.append(args)
        return original(*args)

    load_module.prepare = counting
    try:
        torchdefer.load_state_dict(_partly_real(), _state())
    finally:
        load_module.prepare = original
    return len(seen)


PREPARED = _count_prepared()  # every tensor object the checkpoint fills, real or deferred


@pytest.mark.parametrize("position", range(PREPARED))
def test_a_conversion_failing_changes_nothing(monkeypatch, position):
    """Converting (dtype, device, layout) allocates: it happens while preparing, before the
    first change; an out-of-memory there, at any tensor, leaves everything as it was."""
    model = _partly_real()
    before = _snapshot(model)
    original, seen = load_module.prepare, []

    def failing(group, *args):
        seen.append(group.path)
        if len(seen) == position + 1:
            raise MemoryError(f"injected while converting '{group.path}'")
        return original(group, *args)

    monkeypatch.setattr(load_module, "prepare", failing)
    with pytest.raises(MemoryError, match="injected"):
        torchdefer.load_state_dict(model, _state())
    monkeypatch.undo()
    _assert_unchanged(model, before)
    _then_a_good_load_works(model)


@pytest.mark.parametrize("position", range(COPIES))
def test_an_interrupt_during_the_copies_is_raised_after_the_whole_load(monkeypatch, position):
    """Ctrl-C at any copy: the commit finishes (never half made), then KeyboardInterrupt."""
    original, seen = install_module._copy, []

    def interrupted(target, source):
        seen.append(target)
        if len(seen) == position + 1:
            signal.raise_signal(signal.SIGINT)
        return original(target, source)

    model, state = _partly_real(), _state()
    monkeypatch.setattr(install_module, "_copy", interrupted)
    # Python's own handler, also where SIGINT is ignored (a run started in the
    # background by a non-interactive shell inherits SIG_IGN).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            torchdefer.load_state_dict(model, state)
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.undo()
    assert_same_module(model, _expected(state))


@pytest.mark.parametrize("ignored", [False, True], ids=["own_handler", "SIG_IGN"])
def test_an_interrupt_during_the_copies_goes_to_the_handler_the_user_set(monkeypatch, ignored):
    """The held SIGINT reaches the user's own handler once, after the whole load, in the
    loading thread; under SIG_IGN it is ignored, as it would have been."""
    original, seen, calls = install_module._copy, [], []

    def interrupted(target, source):
        seen.append(target)
        if len(seen) == 1:
            signal.raise_signal(signal.SIGINT)
        return original(target, source)

    def handler(signum, frame):
        calls.append((signum, len(seen)))

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else handler)
    try:
        model, state = _partly_real(), _state()
        monkeypatch.setattr(install_module, "_copy", interrupted)
        torchdefer.load_state_dict(model, state)
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.undo()
    assert calls == ([] if ignored else [(signal.SIGINT, COPIES)])
    assert_same_module(model, _expected(state))


def test_a_plain_copy_failing_anyway_says_the_module_is_partly_loaded(monkeypatch):
    """Copies into plain tensors are not backed up (they cannot fail once checked);
    if the device fails anyway the error says so and names what holds which values."""
    model = _partly_real()
    monkeypatch.setattr(install_module, "_copy",
                        _fails_at("_copy", COPIES - 1, RuntimeError("device lost")))
    with pytest.raises(CheckpointError, match=r"partly loaded.*device lost|device lost.*partly"):
        torchdefer.load_state_dict(model, _state())
    monkeypatch.undo()
    _then_a_good_load_works(model)


def _real_pair() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


def test_sources_that_are_other_targets_are_read_as_they_were_at_the_call():
    """A state dict holding the module's own tensors under other names (swapped): each
    copy reads the value held at the call, not one copied in before it (eager's
    Module.load_state_dict reads the first copy's result: both end up equal)."""
    model = _real_pair()
    a, b = model[0].weight.detach(), model[1].weight.detach()
    state = {"0.weight": b, "1.weight": a, "0.bias": model[1].bias.detach(),
             "1.bias": model[0].bias.detach()}
    expected = _real_pair()
    expected.load_state_dict({k: v.clone() for k, v in state.items()})
    torchdefer.load_state_dict(model, state)
    assert_same_module(model, expected)
    assert not torch.equal(model[0].weight, model[1].weight)


def test_a_deferred_tensor_loaded_from_a_real_ones_memory_gets_its_own_storage():
    """``1.weight`` (deferred) loaded from ``0.weight`` (real, loaded with new values in
    the same call): it keeps the value held at the call, in a storage of its own (it
    took the new values, sharing the storage, before)."""
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_real_pair)
    torchdefer.materialize_module(model[0])
    old = model[0].weight.detach().clone()
    new = torch.ones(4, 4)
    torchdefer.load_state_dict(model, {"0.weight": new, "1.weight": model[0].weight.detach()})
    assert torch.equal(model[0].weight, new) and torch.equal(model[1].weight, old)
    assert model[1].weight.untyped_storage().data_ptr() != model[0].weight.untyped_storage().data_ptr()


def test_a_source_overlapping_its_own_target_is_read_before_the_copy():
    """``w.t()`` into ``w`` (eager's copy_ refuses: partial overlap): the transposed values."""
    model = _real_pair()
    old = model[0].weight.detach().clone()
    torchdefer.load_state_dict(model, {"0.weight": model[0].weight.detach().t()})
    assert torch.equal(model[0].weight, old.t())


def test_the_modules_own_state_dict_loads_without_a_copy_or_a_change():
    model = _real_pair()
    before = _snapshot(model)
    torchdefer.load_state_dict(model, model.state_dict())
    _assert_unchanged(model, before)


def test_a_real_meta_tensor_is_refused_rather_than_loaded_as_nothing():
    model = nn.Linear(2, 2, device="meta")
    with pytest.raises(CheckpointUsageError, match="'weight'.*meta device"):
        torchdefer.load_state_dict(model, {"weight": torch.ones(2, 2), "bias": torch.zeros(2)})
    assert model.weight.is_meta
