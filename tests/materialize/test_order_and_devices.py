"""Materialization in any order, onto any device, without touching global state."""

import gc

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module, assert_same_tensor, build_both
from torchdefer.materialize import DeviceUnavailableError, ExternalTensorModifiedError


def stack():
    return nn.Sequential(
        nn.Linear(6, 6), nn.LayerNorm(6), nn.Linear(6, 4), nn.Embedding(5, 4, padding_idx=0)
    )


def test_reverse_order_materialize_tensor_matches_eager():
    eager, deferred = build_both(stack)
    names = [n for n, _ in eager.named_parameters()]
    fakes = dict(deferred.named_parameters())
    reals = {n: torchdefer.materialize_tensor(fakes[n]) for n in reversed(names)}
    for name, ref in eager.named_parameters():
        assert_same_tensor(reals[name], ref, name)


def test_one_submodule_before_the_rest_matches_eager():
    eager, deferred = build_both(stack)
    torchdefer.materialize_module(deferred[2])
    assert torchdefer.is_deferred(deferred) and not torchdefer.is_deferred(deferred[2])
    torchdefer.materialize_module(deferred)
    assert_same_module(deferred, eager)


def test_materialization_never_changes_the_global_rng():
    _, deferred = build_both(stack)
    before = torch.get_rng_state()
    torchdefer.materialize_module(deferred[2])
    torchdefer.materialize_module(deferred)
    assert torch.equal(torch.get_rng_state(), before)


def test_same_deferred_tensor_gives_the_same_object():
    t = torchdefer.deferred_init(torch.randn, 3)
    assert torchdefer.materialize_tensor(t) is torchdefer.materialize_tensor(t)


def test_real_tensor_is_returned_as_is():
    real = torch.ones(2)
    assert torchdefer.materialize_tensor(real) is real


def test_tensors_sharing_storage_in_eager_share_it_after_materialization():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            flat = torch.randn(10)
            self.a = nn.Parameter(flat[:4].view(2, 2))
            self.register_buffer("b", flat[4:])
            self.register_buffer("c", flat)

    eager, deferred = build_both(Shared)
    torchdefer.materialize_module(deferred, check_fn=lambda m: True)
    assert_same_module(deferred, eager)


def test_shared_storage_survives_materializing_one_tensor_at_a_time():
    def build():
        base = torch.randn(6)
        return base[:3], base[3:], base

    eager, deferred = build_both(build)
    reals = [torchdefer.materialize_tensor(t) for t in reversed(deferred)]
    for real, ref in zip(reversed(reals), eager, strict=True):
        assert torch.equal(real, ref)
    assert reals[0].untyped_storage().data_ptr() == reals[2].untyped_storage().data_ptr()


def test_value_read_before_a_later_mutation_keeps_its_old_value():
    def build():
        w = torch.randn(4)
        snapshot = w.clone()
        w.mul_(2)
        return w, snapshot

    eager, deferred = build_both(build)
    w = torchdefer.materialize_tensor(deferred[0])  # the newer version first
    assert torch.equal(torchdefer.materialize_tensor(deferred[1]), eager[1])
    assert torch.equal(w, eager[0])


def test_materialized_modules_keep_references_taken_before():
    _, deferred = build_both(lambda: nn.Linear(3, 3))
    optimizer = torch.optim.SGD(deferred.parameters(), lr=0.1)
    weight = deferred.weight
    torchdefer.materialize_module(deferred)
    assert optimizer.param_groups[0]["params"][0] is deferred.weight
    assert weight is deferred.weight and not torchdefer.is_fake(weight)
    deferred(torch.randn(2, 3)).sum().backward()
    optimizer.step()


def test_tied_weights_stay_tied():
    def build():
        m = nn.Sequential(nn.Embedding(7, 4), nn.Linear(4, 7, bias=False))
        m[1].weight = m[0].weight
        return m

    eager, deferred = build_both(build)
    torchdefer.materialize_module(deferred)
    assert deferred[1].weight is deferred[0].weight
    assert_same_module(deferred, eager)


def test_buffers_only_leaves_parameters_deferred():
    _, deferred = build_both(lambda: nn.BatchNorm1d(3))
    torchdefer.materialize_module(deferred, buffers_only=True)
    assert not torchdefer.is_fake(deferred.running_mean)
    assert torchdefer.is_fake(deferred.weight)


def test_check_fn_selects_which_modules_materialize():
    _, deferred = build_both(stack)
    torchdefer.materialize_module(deferred, check_fn=lambda m: isinstance(m, nn.LayerNorm))
    assert not torchdefer.is_deferred(deferred[1])
    assert torchdefer.is_deferred(deferred[0])


def test_device_argument_puts_everything_on_that_device():
    eager, _ = build_both(stack)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(lambda: stack().to("cuda"))
    assert deferred[0].weight.is_cuda
    torchdefer.materialize_module(deferred, device="cpu")
    assert all(p.device.type == "cpu" for p in deferred.parameters())
    assert_same_module(deferred, eager)


def test_cuda_tensor_without_cuda_and_without_device_says_to_pass_device():
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    m = torchdefer.deferred_init(nn.Linear, 2, 2, device="cuda")
    with pytest.raises(DeviceUnavailableError, match=r"'weight'.*cuda:0.*device="):
        torchdefer.materialize_module(m)


def test_external_tensor_modified_after_recording_is_detected():
    pretrained = torch.randn(4, 4)

    def build():
        m = nn.Linear(4, 4)
        with torch.no_grad():
            m.weight.copy_(pretrained * 2)
        return m

    deferred = torchdefer.deferred_init(build)
    pretrained.add_(1)
    with pytest.raises(ExternalTensorModifiedError, match=r"shape \(4, 4\).*test_order_and_devices"):
        torchdefer.materialize_module(deferred)


def test_external_tensor_left_alone_is_used():
    pretrained = torch.randn(4, 4)
    deferred = torchdefer.deferred_init(lambda: pretrained * 2)
    assert torch.equal(torchdefer.materialize_tensor(deferred), pretrained * 2)


def test_write_to_an_already_materialized_storage_is_refused():
    base, view = torchdefer.deferred_init(lambda: (lambda b: (b, b[:2]))(torch.zeros(4)))
    torchdefer.materialize_tensor(base)
    with pytest.raises(RuntimeError, match="already materialized"):
        view.add_(1)


def test_replay_failure_names_the_op_and_source_line():
    m = torchdefer.deferred_init(lambda: torch.ones(3, dtype=torch.float32) + 1)
    node = m._value.node
    node.op = torch.ops.aten.mm.default  # corrupt the recording on purpose
    with pytest.raises(RuntimeError, match=r"While replaying aten.mm.default .*test_order_and_devices"):
        torchdefer.materialize_tensor(m)


def test_graph_memory_is_released_after_materialize_tensor_drops():
    t = torchdefer.deferred_init(torch.randn, 1000, 1000)
    real = torchdefer.materialize_tensor(t)
    del t
    gc.collect()
    assert real.shape == (1000, 1000)


def test_writes_a_later_full_overwrite_hides_are_not_replayed():
    calls = []

    @torchdefer.composite(random=False)
    def slow_fill_(t):
        calls.append(1)
        t.fill_(7.0)

    def build():
        w = torch.empty(6, 5)
        slow_fill_(w)  # overwritten below: its values never reach w
        torch.nn.init.normal_(w)
        return w

    torch.manual_seed(0)
    eager = build()
    calls.clear()
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(build)
    assert torch.equal(torchdefer.materialize_tensor(lazy), eager)
    assert calls == []
