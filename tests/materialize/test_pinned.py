"""Pinned memory: deferred tensors pin, answer ``is_pinned`` and refuse as eager does.

On this host (no accelerator) eager refuses every pinning call; each test asks
eager first and expects the same outcome, so on a CUDA host the same tests
check that pinning succeeds. The CUDA-host path is also run here on a
simulated host: ``fake._pinned.pinning_refusal`` says pinning works and
``fake._pinned.pin`` copies (recording what it pinned), since this host has
no page-locked memory to give. ``tests/gpu/test_gpu_pinned.py`` pins for real.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.distributed.shard import replay_local
from torchdefer.fake import _pinned
from torchdefer.fake._pinned import PinnedMemoryError
from torchdefer.materialize._cache import cache_for
from torchdefer.materialize._plan import make_plan
from torchdefer.recorder._graph import NodeKind


def _eager_error(fn) -> RuntimeError | None:
    try:
        fn()
    except RuntimeError as e:
        return e
    return None


PINNING_CALLS = {
    "pin_memory": lambda: torch.randn(4, 3).pin_memory(),
    "pin_memory_of_a_view": lambda: torch.randn(4, 3).t()[1:].pin_memory(),
    "zeros_pin_memory": lambda: torch.zeros(3, pin_memory=True),
    "empty_like_pin_memory": lambda: torch.empty_like(torch.ones(2, 2), pin_memory=True),
    "randn_pin_memory": lambda: torch.randn(5, pin_memory=True),
}


@pytest.mark.parametrize("name", sorted(PINNING_CALLS))
def test_a_pinning_call_fails_or_succeeds_as_eager_does_on_this_host(name):
    build = PINNING_CALLS[name]
    torch.manual_seed(0)
    eager_error = _eager_error(build)
    eager_state = torch.get_rng_state()
    torch.manual_seed(0)
    if eager_error is None:  # a host with an accelerator
        deferred = torchdefer.deferred_init(build)
        assert deferred.is_pinned() and torch.equal(torch.get_rng_state(), eager_state)
        return
    with pytest.raises(PinnedMemoryError) as caught:
        torchdefer.deferred_init(build)
    error = caught.value
    assert isinstance(error, RuntimeError) and isinstance(error, torchdefer.TorchdeferError)
    message = str(error)
    assert str(eager_error) in message, message  # eager's own words
    assert re.search(r"test_pinned.py:\d+ in <lambda>", message), message  # the user's line
    assert "pin_memory=False" in message  # what to do
    # Refused at the call, as eager: the draws before it moved the generator as far.
    assert torch.equal(torch.get_rng_state(), eager_state)


def test_is_pinned_answers_as_eager_for_unpinned_tensors_on_every_device():
    eager = torch.randn(3, 4)
    deferred = torchdefer.deferred_init(torch.randn, 3, 4)
    on_cuda = torchdefer.deferred_init(torch.randn, 3, 4, device="cuda")
    for t in (deferred, deferred.t(), deferred[1:], on_cuda, on_cuda[0]):
        assert t.is_pinned() == eager.is_pinned() == False  # noqa: E712
        assert t.untyped_storage().is_pinned() == eager.untyped_storage().is_pinned()


def test_is_pinned_with_a_device_warns_as_eager():
    eager, deferred = torch.zeros(2), torchdefer.deferred_init(torch.zeros, 2)
    for t in (eager, deferred):
        with pytest.warns(DeprecationWarning, match="'device' of Tensor.is_pinned"):
            assert t.is_pinned("cpu") is False


def test_pinning_a_cuda_tensor_fails_as_eager_whatever_the_host():
    # eager checks the device before the allocator: "only dense CPU tensors"
    eager_error = _eager_error(lambda: torch.zeros(3, device="meta").pin_memory())
    assert eager_error is not None and "only dense CPU tensors can be pinned" in str(eager_error)
    with pytest.raises(PinnedMemoryError, match=r"only dense CPU tensors can be pinned.*'cuda:0'"):
        torchdefer.deferred_init(lambda: torch.zeros(3, device="cuda").pin_memory())


def test_fake_mode_refuses_pinning():
    with torchdefer.fake_mode(), pytest.raises(PinnedMemoryError):
        torch.zeros(3).pin_memory()


# ---- a simulated host with an accelerator ---------------------------------------------


@pytest.fixture
def pinning_host(monkeypatch):
    """Pinning works (as on a CUDA host); ``pin`` copies and lists what it pinned."""
    pinned: list[torch.Tensor] = []

    def pin(real):
        out = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype)
        pinned.append(out.copy_(real))
        return out

    monkeypatch.setattr(_pinned, "pinning_refusal", lambda factory: None)
    monkeypatch.setattr(_pinned, "pin", pin)
    return pinned


def _build():
    w = torch.randn(6, 4)
    p = w[2:5].t().pin_memory()  # eager's _pin_memory keeps sizes and strides
    return w, p, p[1], p.pin_memory(), p.clone(), torch.zeros(3, pin_memory=True)


def test_a_pinned_deferred_tensor_and_its_views_answer_is_pinned(pinning_host):
    w, p, view, again, copy, factory = torchdefer.deferred_init(_build)
    assert [t.is_pinned() for t in (w, p, view, again, copy, factory)] == [
        False, True, True, True, False, True]
    assert again is p  # eager's pin_memory returns a pinned tensor itself
    assert p.untyped_storage().is_pinned() and not w.untyped_storage().is_pinned()
    assert (p.stride(), p.storage_offset()) == ((1, 4), 0)


def test_materializing_a_pinned_tensor_pins_eagers_values(pinning_host):
    torch.manual_seed(0)
    w = torch.randn(6, 4)
    expected = w[2:5].t()
    torch.manual_seed(0)
    _, p, view, *_ = torchdefer.deferred_init(_build)
    real = torchdefer.materialize_tensor(p)
    assert torch.equal(real, expected) and real.stride() == expected.stride()
    assert len(pinning_host) == 1 and real.untyped_storage().data_ptr() == (
        pinning_host[0].untyped_storage().data_ptr())
    real_view = torchdefer.materialize_tensor(view)  # from the cache: the pinned storage
    assert real_view.untyped_storage().data_ptr() == real.untyped_storage().data_ptr()


def test_a_pinned_tensor_of_rows_is_pinned_by_row_replay(pinning_host):
    # FSDP2's CPU offload: a slice of a parameter copied into a padded shard, pinned.
    def build():
        w = torch.randn(8, 4)
        flat = w.new_zeros(4, 4)
        flat.narrow(0, 0, 3).copy_(w[4:7])
        return flat.pin_memory()

    torch.manual_seed(0)
    expected = torch.zeros(4, 4)
    expected[:3] = torch.randn(8, 4)[4:7]
    torch.manual_seed(0)
    shard = torchdefer.deferred_init(build)
    real = replay_local([shard], "shard")[0]
    assert torch.equal(real, expected)
    assert [t.untyped_storage().data_ptr() for t in pinning_host] == [
        real.untyped_storage().data_ptr()]


def test_pinning_a_fake_cuda_tensors_cpu_copy_records_and_replays(pinning_host):
    def build():
        return torch.arange(6.0, device="cuda").reshape(2, 3).cpu().pin_memory()

    pinned = torchdefer.deferred_init(build)
    assert pinned.device.type == "cpu" and pinned.is_pinned()
    # Materialized on the CPU (this host has no CUDA), the values are eager's.
    real = torchdefer.materialize_tensor(pinned, device="cpu")
    assert torch.equal(real, torch.arange(6.0).reshape(2, 3)) and len(pinning_host) == 1



def test_a_pinned_copy_that_a_load_overwrites_replays_no_init(pinning_host):
    # FSDP2's CPU offload pins each shard; dcp.load then copies over all of it.
    loaded = torch.arange(12.0).reshape(4, 3)

    def build():
        shard = torch.empty(4, 3)
        nn.init.kaiming_uniform_(shard)
        pinned = shard.pin_memory()
        pinned[:2].copy_(loaded[:2])
        pinned[2:].copy_(loaded[2:])
        return pinned

    pinned = torchdefer.deferred_init(build)
    plan = make_plan([(pinned._value, pinned._value.storage.version)],
                     cache_for(pinned._graph), "recorded", None)
    assert not [n for n in plan.nodes if n.kind == NodeKind.RANDOM], plan.nodes
    real = torchdefer.materialize_tensor(pinned)
    assert torch.equal(real, loaded) and len(pinning_host) == 1
    assert real.untyped_storage().data_ptr() == pinning_host[0].untyped_storage().data_ptr()


@pytest.mark.parametrize("ambient", ["cuda", "meta"])
def test_pinning_is_asked_of_the_cpu_whatever_the_default_device(ambient):
    build = lambda: torch.zeros(3, device="cpu").pin_memory()  # noqa: E731
    with torch.device(ambient):
        eager_error = _eager_error(build)
        if eager_error is None:
            assert torchdefer.deferred_init(build).is_pinned()
            return
        with pytest.raises(PinnedMemoryError) as caught:
            torchdefer.deferred_init(build)
    assert str(eager_error) in str(caught.value)
