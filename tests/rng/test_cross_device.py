"""Streams replayed on another device than recorded, and on devices of other properties.

A CPU host runs the CUDA side up to the generator states (the kernels need a
GPU: ``make test-gpu`` runs them); CUDA recordings replayed on the CPU are
compared with eager CPU code bit for bit.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from fake_cuda_properties import fake_cuda_properties_fixture  # noqa: F401
from torch import nn

import torchdefer
from torchdefer.errors import DeviceUnavailableError
from torchdefer.recorder._rng_placement import NODE_READER, meta_call
from torchdefer.rng import cuda_increments, philox
from torchdefer.rng._stream import call_effect
from torchdefer.rng.philox import DeviceShape

CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)


def streams(tensor):
    return list(tensor._graph.rng.streams.values())


def philox_starts(stream, epoch, device):
    """(seed, offset) where each call of ``epoch`` starts when replayed on ``device``."""
    states = stream.epochs[0].calls[0].graph.rng.states
    layout = states.layout(stream, epoch, device)
    return [philox.offset_of(states.state_at(stream, epoch, device, p)) for p in layout.starts]


def table_offsets(calls, device, start=0):
    """Offsets the table gives each call, counted from ``start``."""
    shape = DeviceShape.of(device)
    offsets = []
    for node in calls:
        offsets.append(start)
        args, kwargs, drawn = meta_call(node)
        start += cuda_increments.increment(node.op, args, kwargs, drawn, shape)
    return offsets


# ----------------------------------------------------- CUDA recorded, CPU replay


def _mixed(device):
    a = torch.empty(5, 4, device=device).bernoulli_(0.3)
    b = nn.init.trunc_normal_(torch.empty(7, 3, device=device), std=0.02)
    seen = float(b.sum())  # a data-dependent read replays while recording
    c = torch.randn(3, device=device)
    d = torch.empty(2, 9, device=device).t().bernoulli_(0.5)
    return a, b, c, d, seen


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_fake_cuda_bernoulli_trunc_normal_and_reads_replay_on_cpu_in_any_order(order):
    torch.manual_seed(3)
    eager = _mixed("cpu")
    if torch.cuda.is_available():  # a real GPU: the read runs there, as eager's on CUDA
        torch.manual_seed(3)
        eager = (*eager[:4], _mixed("cuda")[4])
    torch.manual_seed(3)
    deferred = torchdefer.deferred_init(_mixed, "cuda")
    assert deferred[4] == eager[4]
    for i in order:
        got = torchdefer.materialize_tensor(deferred[i], device="cpu")
        assert torch.equal(got, eager[i]), i


def test_a_fake_cuda_recording_replayed_on_cpu_continues_where_the_cpu_generator_stood():
    torch.manual_seed(0)
    torch.randn(5)  # drawn before the recording: same code on the CPU starts after these
    deferred = torchdefer.deferred_init(lambda: torch.randn(3, device="cuda"))
    torch.manual_seed(0)
    torch.randn(5)
    expected = torch.randn(3)
    assert torch.equal(torchdefer.materialize_tensor(deferred, device="cpu"), expected)


def test_a_reseed_inside_a_fake_cuda_recording_reseeds_the_cpu_replay():
    def build(device):
        a = torch.randn(4, device=device)
        torch.manual_seed(11)
        return a, torch.rand(6, device=device)

    torch.manual_seed(2)
    eager = build("cpu")
    torch.manual_seed(2)
    deferred = torchdefer.deferred_init(build, "cuda")
    for i in (1, 0):
        assert torch.equal(torchdefer.materialize_tensor(deferred[i], device="cpu"), eager[i])


# ----------------------------------------------------- CPU recorded, CUDA replay


def test_a_cpu_recorded_linear_placed_for_cuda_starts_at_the_seed_and_counts_the_table(
    fake_cuda_properties,
):
    torch.manual_seed(7)
    model = torchdefer.deferred_init(lambda: nn.Sequential(nn.Linear(300, 200), nn.Linear(200, 5)))
    (stream,) = streams(model[0].weight)
    (epoch,) = stream.epochs
    starts = philox_starts(stream, epoch, CUDA0)
    assert [seed for seed, _ in starts] == [7] * len(epoch.calls)
    assert [offset for _, offset in starts] == table_offsets(epoch.calls, CUDA0)


def test_each_replay_device_counts_with_its_own_properties(fake_cuda_properties):
    def build():
        return torch.randn(2_000_000), torch.rand(3_000_000), torch.randn(5)

    torch.manual_seed(1)
    tensors = torchdefer.deferred_init(build)
    (stream,) = streams(tensors[0])
    (epoch,) = stream.epochs
    on_h100 = [offset for _, offset in philox_starts(stream, epoch, CUDA0)]
    on_small = [offset for _, offset in philox_starts(stream, epoch, CUDA1)]
    assert on_h100 == table_offsets(epoch.calls, CUDA0)
    assert on_small == table_offsets(epoch.calls, CUDA1)
    assert on_h100 != on_small  # the grids differ, so do the positions


def test_a_reseed_inside_a_cpu_recording_starts_the_cuda_replay_from_that_seed(
    fake_cuda_properties,
):
    other = torch.Generator().manual_seed(9)
    torch.randn(3, generator=other)
    elsewhere = other.get_state()  # a state this recording never produced

    def build():
        a = torch.randn(10)
        torch.manual_seed(5)
        b = torch.randn(10)
        torch.set_rng_state(elsewhere)
        return a, b, torch.randn(10)

    torch.manual_seed(4)
    tensors = torchdefer.deferred_init(build)
    (stream,) = streams(tensors[0])
    first, reseeded, restored = stream.epochs
    assert philox_starts(stream, first, CUDA0) == [(4, 0)]
    assert philox_starts(stream, reseeded, CUDA0) == [(5, 0)]
    # A state eager code sets on the CPU only: the CUDA generator goes on.
    assert philox_starts(stream, restored, CUDA0) == [(5, table_offsets(reseeded.calls, CUDA0)[0] + 4)]


def test_a_cpu_recording_on_a_host_without_that_cuda_device_names_both_devices():
    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU, or cuda:0 on a CPU host
    model = torchdefer.deferred_init(nn.Linear, 3, 4)
    with pytest.raises(DeviceUnavailableError) as caught:
        torchdefer.materialize_module(model, device=missing)
    message = str(caught.value)
    assert "recorded on 'cpu'" in message and f"materialized on '{missing}'" in message
    assert "recorded on 'cuda" not in message


def test_randint_like_with_a_tensor_high_is_an_anchor_for_cuda_and_replays_like_eager(
    fake_cuda_properties, monkeypatch
):
    def build():
        a = torch.randint_like(torch.empty(6), torch.tensor(50))
        return a, torch.randn(4)

    torch.manual_seed(8)
    eager = build()
    torch.manual_seed(8)
    deferred = torchdefer.deferred_init(build)
    (stream,) = streams(deferred[0])
    node = stream.epochs[0].calls[0]
    with monkeypatch.context() as patched:  # as on a CUDA host, where the model is asked
        patched.setattr(torch.cuda, "is_available", lambda: True)
        assert call_effect(node, CUDA0, NODE_READER) is None  # run, not counted (was a TypeError)
    for i in (1, 0):
        assert torch.equal(torchdefer.materialize_tensor(deferred[i]), eager[i])


def test_a_users_cpu_generator_placed_for_cuda_starts_from_its_own_seed(fake_cuda_properties):
    def build():
        g = torch.Generator().manual_seed(torch.initial_seed())  # the default's seed, own stream
        return torch.randn(5, generator=g), torch.rand(3, generator=g)

    torch.manual_seed(12)
    tensors = torchdefer.deferred_init(build)
    (stream,) = [s for s in streams(tensors[0]) if s.generator is not None]
    (epoch,) = stream.epochs
    assert philox_starts(stream, epoch, CUDA0) == [(12, 0), (12, 4)]


def test_randint_like_with_a_tensor_high_onto_cuda_is_run_there_and_replays_like_eager(
    fake_cuda_properties, monkeypatch
):
    high = torch.tensor(50)  # eager wants it on the CPU, whatever device= says

    def build(device):
        return torch.randint_like(torch.empty(6), high, device=device), torch.randn(4, device=device)

    torch.manual_seed(8)
    eager = build("cpu")
    torch.manual_seed(8)
    deferred = torchdefer.deferred_init(build, "cuda")
    (stream,) = streams(deferred[0])
    with monkeypatch.context() as patched:
        patched.setattr(torch.cuda, "is_available", lambda: True)
        assert call_effect(stream.epochs[0].calls[0], CUDA0, NODE_READER) is None
    for i in (1, 0):
        assert torch.equal(torchdefer.materialize_tensor(deferred[i], device="cpu"), eager[i])


def test_randint_like_of_a_cuda_tensor_with_a_cpu_scalar_high_records_as_eager_accepts_it():
    # A composite kernel: eager checks no devices for it (torchgen checks only in
    # CUDA/XPU wrappers); high must be a CPU 0-dim tensor.
    def build(device):
        return torch.randint_like(torch.empty(6, device=device), torch.tensor(50)), torch.rand(2, device=device)

    torch.manual_seed(5)
    eager = build("cpu")
    torch.manual_seed(5)
    deferred = torchdefer.deferred_init(build, "cuda")
    assert deferred[0].device.type == "cuda"
    for i in (1, 0):
        assert torch.equal(torchdefer.materialize_tensor(deferred[i], device="cpu"), eager[i])


def test_a_composite_op_mixing_a_cuda_input_with_a_cpu_weight_is_still_refused():
    with pytest.raises(RuntimeError, match="same device"):
        torchdefer.deferred_init(
            lambda: torch.nn.functional.conv1d(torch.ones(1, 1, 4, device="cuda"), torch.ones(1, 1, 2))
        )


@pytest.mark.parametrize("read", ["get_rng_state", "generator.get_state"])
@pytest.mark.parametrize("other_thread", [False, True])
def test_a_restore_inside_a_cpu_recording_placed_for_cuda_restores_there_and_warns(
    fake_cuda_properties, read, other_thread
):
    # With another Python thread alive the recorder leaves exact states, not
    # markers, in the generator: a restore of one is still known as a restore.
    import threading

    from torchdefer.rng._states import CrossDeviceRestoreWarning

    release = threading.Event()
    waiter = threading.Thread(target=release.wait)
    if other_thread:
        waiter.start()
    try:
        _restore_placed_for_cuda(read, CrossDeviceRestoreWarning)
    finally:
        release.set()
        if other_thread:
            waiter.join()


def _restore_placed_for_cuda(read, CrossDeviceRestoreWarning):

    def build():
        first = torch.randn(7)
        if read == "get_rng_state":  # what fork_rng does: an exact state
            saved = torch.get_rng_state()
        else:  # a marker standing for the position
            saved = torch.default_generator.get_state()
        a = torch.randn(10)
        torch.set_rng_state(saved)
        return first, a, torch.randn(10)

    torch.manual_seed(3)
    tensors = torchdefer.deferred_init(build)
    (stream,) = streams(tensors[0])
    first, restored = stream.epochs
    with pytest.warns(CrossDeviceRestoreWarning, match="fork_rng"):
        starts = philox_starts(stream, restored, CUDA0)
    assert starts == philox_starts(stream, first, CUDA0)[1:]  # where `a` started
    # On the CPU the restore is exact, as before.
    torch.manual_seed(3)
    eager = build()
    for i in (2, 0, 1):
        assert torch.equal(torchdefer.materialize_tensor(tensors[i]), eager[i])


def test_loading_a_cpu_recording_onto_a_device_this_host_lacks_names_both_devices():
    missing = f"cuda:{torch.cuda.device_count()}"
    model = torchdefer.deferred_init(nn.Linear, 2, 2)
    state = {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}
    with pytest.raises(RuntimeError) as caught:
        torchdefer.load_state_dict(model, state, device=missing)
    message = str(caught.value)
    assert "recorded on 'cpu'" in message and f"loaded onto '{missing}'" in message
