"""Lazy modules: constructed deferred, shapes inferred on the first call, values as eager."""

import pytest
import torch
from torch import nn
from torch.nn.parameter import UninitializedParameter

import torchdefer
from parity import assert_same_module, build_both


def _convnet():
    return nn.Sequential(
        nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3)
    )


def test_dry_run_inside_deferred_init_infers_shapes_and_matches_eager():
    def build():
        m = _convnet().eval()
        m(torch.randn(2, 3, 8, 8))  # the input is deferred too
        return m

    eager, deferred = build_both(build)
    assert isinstance(deferred[4], nn.Linear) and deferred[4].weight.shape == (3, 144)
    torchdefer.materialize_module(deferred)
    assert_same_module(deferred, eager)


@pytest.mark.parametrize("deferred_input", [False, True])
def test_first_call_after_deferred_init_infers_shapes_and_matches_eager(deferred_input):
    def build():
        return nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2), nn.LazyConv1d(2, 1))

    torch.manual_seed(0)
    eager = build()
    eager(torch.ones(2, 5, 3))
    torch.manual_seed(0)
    deferred, x = torchdefer.deferred_init(lambda: (build(), torch.ones(2, 5, 3)))
    assert isinstance(deferred[0].weight, UninitializedParameter)
    deferred(x if deferred_input else torch.ones(2, 5, 3))  # the lazy inits: recorded, not run
    assert type(deferred[0]) is nn.Linear and torchdefer.is_fake(deferred[0].weight)
    torchdefer.materialize_module(deferred)
    assert_same_module(deferred, eager)


def test_lazy_module_never_called_stays_uninitialized_like_eager():
    eager, deferred = build_both(lambda: nn.LazyLinear(3))
    torchdefer.materialize_module(deferred)
    assert type(deferred.weight) is type(eager.weight) is UninitializedParameter
    assert not torchdefer.is_fake(deferred.weight)


def test_using_an_uninitialized_parameter_raises_as_in_eager():
    deferred = torchdefer.deferred_init(nn.LazyLinear, 3)
    with pytest.raises(ValueError, match="uninitialized parameter"):
        deferred.weight + 1
    with pytest.raises(RuntimeError, match="Can't access the shape"):
        _ = deferred.weight.shape


def test_deepcopy_and_dtype_change_of_an_uninitialized_lazy_module_match_eager():
    import copy

    def build():
        return nn.Sequential(nn.LazyLinear(3), nn.LazyLinear(2)).to(torch.float64)

    x = torch.ones(2, 5, dtype=torch.float64)
    torch.manual_seed(0)
    eager = build()
    eager_copy = copy.deepcopy(eager)
    eager(x)
    eager_copy(x)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    deferred_copy = copy.deepcopy(deferred)
    deferred(x)
    deferred_copy(x)
    for real, ref in ((deferred, eager), (deferred_copy, eager_copy)):
        torchdefer.materialize_module(real)
        assert_same_module(real, ref)


def test_lazy_module_loads_a_state_dict_before_its_first_call():
    torch.manual_seed(0)
    source = nn.Linear(4, 3)
    eager, deferred = build_both(lambda: nn.LazyLinear(3))
    for m in (eager, deferred):
        m.load_state_dict(source.state_dict())
    assert torchdefer.is_deferred(deferred)
    torchdefer.materialize_module(deferred)
    assert_same_module(deferred, eager)
    assert torch.equal(deferred.weight, source.weight)
