"""References taken before materialization see the real tensors (materialize/_swap.py)."""

import weakref

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module, assert_same_tensor, build_both
from torchdefer.materialize import SwapError


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    out = model(x)
    out = out[0] if isinstance(out, tuple) else out
    out.pow(2).mean().backward()
    optimizer.step()


def _optimizer_sees_the_model_like_eager(build, x: torch.Tensor) -> None:
    """An optimizer built on the deferred model trains it exactly as eager's trains eager."""
    eager, deferred = build_both(build)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_deferred = torch.optim.SGD(deferred.parameters(), lr=0.1)
    torchdefer.materialize_module(deferred)
    params = opt_deferred.param_groups[0]["params"]
    assert all(not torchdefer.is_fake(p) for p in params)
    assert [id(p) for p in params] == [id(p) for p in deferred.parameters()]
    _train_step(eager, opt_eager, x)
    _train_step(deferred, opt_deferred, x)
    assert_same_module(deferred, eager)


def test_optimizer_built_on_a_deferred_lstm_trains_the_real_lstm():
    # nn.LSTM keeps a weakref to each parameter, which torch.utils.swap_tensors refuses.
    _optimizer_sees_the_model_like_eager(lambda: nn.LSTM(3, 4, num_layers=2), torch.randn(5, 2, 3))


def test_optimizer_sees_real_tensors_while_a_view_of_a_parameter_is_alive():
    def build():
        m = nn.Linear(3, 4)
        m.first_row = m.weight[0]  # a view kept alive (the impl has another owner)
        return m

    _optimizer_sees_the_model_like_eager(build, torch.randn(2, 3))


def test_view_of_a_parameter_taken_before_materialization_still_reads_the_real_values():
    eager, deferred = build_both(lambda: nn.Linear(3, 4))
    view = deferred.weight[1]
    torchdefer.materialize_module(deferred)
    assert_same_tensor(torchdefer.materialize_tensor(view), eager.weight[1])
    real_view = torchdefer.materialize_tensor(view)
    assert real_view.untyped_storage().data_ptr() == deferred.weight.untyped_storage().data_ptr()


def test_weakref_list_of_parameters_and_hook_closure_see_the_real_tensors():
    eager, deferred = build_both(lambda: nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2)))
    weak = [weakref.ref(p) for p in deferred.parameters()]
    listed = list(deferred.parameters())
    groups = [{"params": listed[:2]}, {"params": listed[2:], "lr": 0.5}]
    seen = []
    held = deferred[1].weight
    deferred[1].register_forward_hook(lambda m, i, o: seen.append(held.sum()))
    torchdefer.materialize_module(deferred)
    real = list(deferred.parameters())
    assert [w() for w in weak] == real and all(a is b for a, b in zip(listed, real, strict=True))
    assert all(not torchdefer.is_fake(p) for g in groups for p in g["params"])
    deferred(torch.randn(1, 3))
    assert torch.equal(seen[0], eager[1].weight.sum())


def test_lstm_flat_weights_are_the_real_parameters_and_forward_matches_eager():
    eager, deferred = build_both(lambda: nn.LSTM(4, 6, num_layers=2))
    torchdefer.materialize_module(deferred)
    assert all(w is p for w, p in zip(deferred._flat_weights, deferred.parameters(), strict=True))
    assert not deferred._weights_have_changed()
    x = torch.randn(3, 2, 4)
    assert torch.equal(deferred(x)[0], eager(x)[0])


def test_tensor_hooks_registered_while_deferred_run_after_materialization():
    def build(calls):
        m = nn.Linear(3, 1)
        m.weight.register_hook(lambda g: calls.append("grad") or g * 0)
        m.bias.register_post_accumulate_grad_hook(lambda p: calls.append("accumulated"))
        return m

    eager_calls, deferred_calls = [], []
    torch.manual_seed(0)
    eager = build(eager_calls)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build, deferred_calls)
    torchdefer.materialize_module(deferred)
    x = torch.randn(2, 3)
    for m in (eager, deferred):
        m(x).sum().backward()
    assert deferred_calls == eager_calls and sorted(eager_calls) == ["accumulated", "grad"]
    assert torch.equal(deferred.weight.grad, eager.weight.grad)


def test_attributes_set_on_a_deferred_parameter_stay_on_the_real_one():
    def build():
        m = nn.Linear(3, 3)
        m.weight._no_weight_decay = True
        m.bias.sharding = {"dim": 0}
        return m

    eager, deferred = build_both(build)
    torchdefer.materialize_module(deferred)
    assert deferred.weight._no_weight_decay is True
    assert deferred.bias.sharding == eager.bias.sharding
    assert not hasattr(deferred.weight, "_value") and not hasattr(deferred.weight, "_graph")


def test_refused_swap_names_the_tensor_and_says_what_to_do():
    _, deferred = build_both(lambda: nn.Sequential(nn.Linear(2, 2)))
    holder = torch._C._WeakTensorRef(deferred[0].weight)  # a C++ weak reference
    with pytest.raises(SwapError, match=r"'0\.weight'.*weak reference.*materialize_module again"):
        torchdefer.materialize_module(deferred)
    assert torchdefer.is_fake(deferred[0].weight)  # left as it was, not half-swapped
    del holder
    torchdefer.materialize_module(deferred)
    assert not torchdefer.is_deferred(deferred)


def test_grads_of_a_backward_pass_run_during_construction_are_kept():
    def build():
        m = nn.Linear(3, 2)
        m(torch.randn(4, 3)).pow(2).sum().backward()
        return m

    eager, deferred = build_both(build)
    torchdefer.materialize_module(deferred)
    for name, param in deferred.named_parameters():
        assert_same_tensor(param.grad, dict(eager.named_parameters())[name].grad, name)


def test_materialize_module_inside_deferred_init_gives_real_parameters():
    def build():
        first = nn.Linear(3, 3)
        torchdefer.materialize_module(first)
        assert not torchdefer.is_fake(first.weight) and type(first.weight) is nn.Parameter
        return nn.Sequential(first, nn.Linear(3, 2))

    eager, deferred = build_both(build)
    torchdefer.materialize_module(deferred)
    assert_same_module(deferred, eager)
