"""``pin_memory=True`` on every factory, under ``fake_mode`` and ``deferred_init``, as eager.

Eager pins at the call or refuses there (this host has no accelerator:
"pin_memory=True requires a CUDA or other accelerator backend"). Each test
asks eager first. ``deferred_init`` records the pinning (``is_pinned()``
answers True, materialization pins); ``fake_mode`` records nothing, so where
eager would pin it refuses rather than hand out an unpinned fake. The
accelerator host is simulated as in ``tests/materialize/test_pinned.py``.
"""

from __future__ import annotations

import re

import pytest
import torch

import torchdefer
from torchdefer.fake import _mode as fake_mode_module
from torchdefer.fake import _pinned
from torchdefer.fake._pinned import PinnedMemoryError
from torchdefer.recorder import _record as record

FACTORIES = {
    "empty": lambda pin=True: torch.empty(3, pin_memory=pin),
    "zeros": lambda pin=True: torch.zeros(3, pin_memory=pin),
    "ones": lambda pin=True: torch.ones(2, 3, pin_memory=pin),
    "full": lambda pin=True: torch.full((3,), 2.0, pin_memory=pin),
    "randn": lambda pin=True: torch.randn(3, pin_memory=pin),
    "rand": lambda pin=True: torch.rand(3, pin_memory=pin),
    "randint": lambda pin=True: torch.randint(5, (3,), pin_memory=pin),
    "randperm": lambda pin=True: torch.randperm(5, pin_memory=pin),
    "normal": lambda pin=True: torch.normal(0.0, 1.0, (3,), pin_memory=pin),
    "arange": lambda pin=True: torch.arange(3, pin_memory=pin),
    "linspace": lambda pin=True: torch.linspace(0, 1, 3, pin_memory=pin),
    "logspace": lambda pin=True: torch.logspace(0, 1, 3, pin_memory=pin),
    "eye": lambda pin=True: torch.eye(3, pin_memory=pin),
    "scalar_tensor": lambda pin=True: torch.scalar_tensor(1.0, pin_memory=pin),
    "tril_indices": lambda pin=True: torch.tril_indices(3, 3, pin_memory=pin),
    "hann_window": lambda pin=True: torch.hann_window(4, pin_memory=pin),
    "bartlett_window": lambda pin=True: torch.bartlett_window(4, pin_memory=pin),
    "empty_strided": lambda pin=True: torch.empty_strided((2, 3), (1, 2), pin_memory=pin),
    "zeros_like": lambda pin=True: torch.zeros_like(torch.ones(2, 3).t(), pin_memory=pin),
    "empty_like": lambda pin=True: torch.empty_like(torch.ones(3), pin_memory=pin),
    "full_like": lambda pin=True: torch.full_like(torch.ones(3), 1.5, pin_memory=pin),
    "randn_like": lambda pin=True: torch.randn_like(torch.ones(3), pin_memory=pin),
    "new_empty": lambda pin=True: torch.ones(3).new_empty(2, pin_memory=pin),
    "new_zeros": lambda pin=True: torch.ones(3).new_zeros(2, pin_memory=pin),
    "new_ones": lambda pin=True: torch.ones(3).new_ones(2, pin_memory=pin),
    "new_full": lambda pin=True: torch.ones(3).new_full((2,), 4.0, pin_memory=pin),
}


def _in_fake_mode(build):
    with torchdefer.fake_mode():
        return build()


def _eager_error(build):
    try:
        build()
    except RuntimeError as error:
        return error
    return None


@pytest.mark.parametrize("how", ["fake_mode", "deferred_init"])
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_a_pinning_factory_is_refused_or_pinned_as_eager(name, how):
    build = FACTORIES[name]
    torch.manual_seed(0)
    eager_error = _eager_error(build)
    eager_state = torch.get_rng_state()
    torch.manual_seed(0)
    run = _in_fake_mode if how == "fake_mode" else torchdefer.deferred_init
    if eager_error is None:  # a host with an accelerator
        if how == "fake_mode":
            with pytest.raises(PinnedMemoryError, match="fake_mode, which records nothing"):
                run(build)
        else:
            assert run(build).is_pinned()
        return
    with pytest.raises(PinnedMemoryError) as caught:
        run(build)
    message = str(caught.value)
    assert isinstance(caught.value, RuntimeError) and str(eager_error) in message, message
    assert re.search(r"test_pinned_factories.py:\d+ in <lambda>", message), message
    assert torch.equal(torch.get_rng_state(), eager_state)  # refused at the call


@pytest.mark.parametrize("how", ["fake_mode", "deferred_init"])
def test_torch_tensor_with_pin_memory_fails_or_pins_as_eager(how):
    build = lambda: torch.tensor([1.0, 2.0], pin_memory=True)  # noqa: E731
    eager_error = _eager_error(build)
    run = _in_fake_mode if how == "fake_mode" else torchdefer.deferred_init
    if eager_error is None:
        if how == "deferred_init":
            assert run(build).is_pinned()
        return
    with pytest.raises(RuntimeError) as caught:  # torch pins before any mode sees the call
        run(build)
    assert str(caught.value) == str(eager_error)


@pytest.mark.parametrize("how", ["fake_mode", "deferred_init"])
def test_unpinned_neighbours_answer_is_pinned_as_eager(how):
    def build():
        x = torch.ones(4, 3)
        return (x.to("cpu", non_blocking=True), x.to(torch.float64, non_blocking=True),
                torch.empty(2, pin_memory=False), torch.zeros_like(x, pin_memory=False),
                x.new_empty(3, pin_memory=False), x.t()[1:])

    eager = build()
    run = _in_fake_mode if how == "fake_mode" else torchdefer.deferred_init
    got = run(build)
    assert [t.is_pinned() for t in got] == [t.is_pinned() for t in eager] == [False] * 6


# ---- a simulated host with an accelerator ---------------------------------------------


@pytest.fixture
def pinning_host(monkeypatch):
    pinned: list[torch.Tensor] = []

    def pin(real):
        out = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype)
        pinned.append(out.copy_(real))
        return out

    monkeypatch.setattr(_pinned, "pinning_refusal", lambda factory: None)
    monkeypatch.setattr(_pinned, "pin", pin)
    return pinned


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_where_eager_pins_deferred_init_records_and_replay_pins(name, pinning_host):
    torch.manual_seed(0)
    expected = FACTORIES[name](False)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(FACTORIES[name])
    assert deferred.is_pinned() and deferred.untyped_storage().is_pinned()
    if deferred.dim():
        assert deferred[:1].is_pinned() and not deferred.clone().is_pinned()
    real = torchdefer.materialize_tensor(deferred)
    assert len(pinning_host) == 1
    assert real.untyped_storage().data_ptr() == pinning_host[0].untyped_storage().data_ptr()
    assert real.stride() == expected.stride() and real.dtype == expected.dtype
    if name not in ("empty", "empty_strided", "empty_like", "new_empty"):
        assert torch.equal(real, expected)


def test_where_eager_pins_fake_mode_refuses_every_pinning_call(pinning_host):
    for build in FACTORIES.values():
        with pytest.raises(PinnedMemoryError, match="fake_mode, which records nothing"):
            _in_fake_mode(build)
    with pytest.raises(PinnedMemoryError, match="fake_mode, which records nothing"):
        _in_fake_mode(lambda: torch.ones(3).pin_memory())


def test_a_lifted_pinned_tensor_is_recorded_pinned(pinning_host, monkeypatch):
    """``torch.tensor(data, pin_memory=True)`` pins a real tensor, then lifts it."""
    for module in (record, fake_mode_module):
        monkeypatch.setattr(module, "lifted_is_pinned", lambda real: True)
    deferred = torchdefer.deferred_init(lambda: torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert deferred.is_pinned() and deferred[1].is_pinned()
    real = torchdefer.materialize_tensor(deferred)
    assert torch.equal(real, torch.tensor([[1.0, 2.0], [3.0, 4.0]])) and len(pinning_host) == 1
    with pytest.raises(PinnedMemoryError, match="fake_mode, which records nothing"):
        _in_fake_mode(lambda: torch.tensor([1.0, 2.0]))
