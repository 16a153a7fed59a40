"""In-process checks of torchdefer.distributed on a one-rank group: errors, restored state, CUDA."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import _init_utils, fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

import torchdefer
import torchdefer.distributed as tdd
from torchdefer.recorder import RecordingError

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="needs torch.distributed"
)


@pytest.fixture
def one_rank_group():
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    torch.distributed.init_process_group(
        backend, store=torch.distributed.HashStore(), rank=0, world_size=1
    )
    try:
        yield "cuda" if backend == "nccl" else "cpu"
    finally:
        torch.distributed.destroy_process_group()


def test_fsdp1_deferred_init_restores_fsdp1_also_when_the_block_raises():
    original = _init_utils._need_to_materialize_module
    had_shim = hasattr(_init_utils, "deferred_init")
    with pytest.raises(KeyError), tdd.fsdp1_deferred_init():
        assert _init_utils._need_to_materialize_module is not original
        raise KeyError("user code fails inside the block")
    assert _init_utils._need_to_materialize_module is original
    assert hasattr(_init_utils, "deferred_init") == had_shim


def test_fsdp1_check_sees_deferred_modules_only_inside_the_block():
    model = torchdefer.deferred_init(nn.Linear, 3, 3)
    assert _init_utils._need_to_materialize_module(model, set(), set()) == (False, False)
    with tdd.fsdp1_deferred_init():
        assert _init_utils._need_to_materialize_module(model, set(), set()) == (False, True)
        real = nn.Linear(3, 3)
        assert _init_utils._need_to_materialize_module(real, set(), set()) == (False, False)


def test_param_init_fn_materializes_only_the_module_it_is_given():
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    torch.manual_seed(0)
    model = torchdefer.deferred_init(lambda: nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)))
    tdd.param_init_fn(model[1])
    assert torchdefer.is_deferred(model[0]) and not torchdefer.is_deferred(model[1])
    assert torch.equal(model[1].weight, eager[1].weight)
    tdd.param_init_fn(model[0])
    assert torch.equal(model[0].bias, eager[0].bias)


def test_materialize_dtensor_refuses_partial_placements(one_rank_group):
    mesh = init_device_mesh(one_rank_group, (1,))
    weight = torchdefer.deferred_init(torch.randn, 4, 4, device=one_rank_group)
    with pytest.raises(ValueError, match="Partial"):
        tdd.materialize_dtensor(weight, mesh, [Partial()])


def test_materialize_dtensor_wants_one_placement_per_mesh_dimension(one_rank_group):
    mesh = init_device_mesh(one_rank_group, (1,))
    weight = torchdefer.deferred_init(torch.randn, 4, 4, device=one_rank_group)
    with pytest.raises(ValueError, match="one placement per mesh dimension"):
        tdd.materialize_dtensor(weight, mesh, [Shard(0), Shard(1)])


def test_materialize_dtensor_of_a_real_tensor_slices_it_locally(one_rank_group):
    mesh = init_device_mesh(one_rank_group, (1,))
    real = torch.randn(4, 4, device=one_rank_group)
    out = tdd.materialize_dtensor(real, mesh, [Shard(0)])
    assert torch.equal(out.to_local(), real)


def test_fsdp2_on_one_rank_matches_eager_on_its_device(one_rank_group):
    device = one_rank_group

    def build():
        return nn.Sequential(nn.Linear(8, 16, device=device), nn.LayerNorm(16, device=device))

    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(build)
    fully_shard(model[0])
    fully_shard(model)
    tdd.materialize_module(model)
    for (name, param), ref in zip(model.named_parameters(), eager.parameters(), strict=True):
        assert param.to_local().device.type == device, name
        assert torch.equal(param.to_local(), ref), name
    x = torch.randn(2, 8, device=device)
    torch.testing.assert_close(model(x), eager(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fsdp2_shards_recorded_on_cuda_are_created_on_cuda(one_rank_group):
    torch.manual_seed(0)
    eager = nn.Linear(32, 32, device="cuda")
    torch.manual_seed(0)
    model = torchdefer.deferred_init(nn.Linear, 32, 32, device="cuda")
    fully_shard(model)
    tdd.materialize_module(model)
    assert model.weight.to_local().is_cuda
    assert torch.equal(model.weight.to_local(), eager.weight)


def test_core_materialize_module_hands_fsdp2_modules_to_the_sharded_path(one_rank_group):
    device = one_rank_group

    def build():
        return nn.Sequential(nn.Linear(8, 16, device=device), nn.Linear(16, 4, device=device))

    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(build)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    assert torchdefer.is_deferred(model)
    torchdefer.materialize_module(model)  # the user's code keeps its shape
    assert not torchdefer.is_deferred(model)
    for param, ref in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(param.full_tensor(), ref)


def test_core_materialize_module_refuses_device_for_sharded_modules(one_rank_group):
    model = torchdefer.deferred_init(nn.Linear, 4, 4)
    fully_shard(model)
    with pytest.raises(TypeError, match=r"'weight'.*sharded.*without device="):
        torchdefer.materialize_module(model, device="cpu")


def test_explain_and_is_deferred_agree_on_fsdp2_parameters(one_rank_group):
    model = torchdefer.deferred_init(nn.Linear, 8, 4)
    fully_shard(model)
    assert torchdefer.is_deferred(model.weight)
    text = torchdefer.explain(model.weight, model)
    assert "local shard of a DTensor" in text and "deferred Parameter" in text
    assert "normal_" in text or "uniform_" in text
    tdd.materialize_module(model)
    assert not torchdefer.is_deferred(model.weight)
    assert "not deferred" in torchdefer.explain(model.weight, model)


def test_load_state_dict_into_an_fsdp2_model_on_one_rank(one_rank_group):
    device = one_rank_group

    def build():
        return nn.Sequential(nn.Linear(8, 16, device=device), nn.Linear(16, 4, device=device))

    torch.manual_seed(1)
    state = {k: v for k, v in build().state_dict().items() if k.startswith("0.")}
    torch.manual_seed(0)
    eager = build()
    eager.load_state_dict(state, strict=False)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(build)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    result = torchdefer.load_state_dict(model, state)
    assert result.missing_keys == ("1.weight", "1.bias")
    assert not torchdefer.is_deferred(model)
    for (name, param), ref in zip(model.named_parameters(), eager.parameters(), strict=True):
        assert torch.equal(param.full_tensor(), ref), name
    x = torch.randn(2, 8, device=device)
    torch.testing.assert_close(model(x), eager(x))


def test_load_state_dict_refuses_dtype_for_sharded_models(one_rank_group):
    model = torchdefer.deferred_init(nn.Linear, 8, 4)
    fully_shard(model)
    with pytest.raises(TypeError, match="sharded"):
        torchdefer.load_state_dict(model, {}, dtype=torch.bfloat16)


def test_collective_on_a_deferred_tensor_says_to_use_src_data_rank_none(one_rank_group):
    t = torchdefer.deferred_init(torch.randn, 4, device=one_rank_group)
    with pytest.raises(RecordingError, match=r"broadcast.*deferred tensor.*src_data_rank=None"):
        torch.distributed.broadcast(t, src=0)


def test_default_src_data_rank_on_a_deferred_model_raises_with_the_fix(one_rank_group):
    torch.manual_seed(0)
    eager = nn.Linear(4, 4, device=one_rank_group)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(nn.Linear, 4, 4, device=one_rank_group)
    mesh = init_device_mesh(one_rank_group, (1,))
    try:
        parallelize_module(model, mesh, {"": ColwiseParallel()})
    except RecordingError as e:
        assert "scatter" in str(e) and "src_data_rank=None" in str(e), str(e)
    else:
        # torch 2.8's parallelize_module leaves a one-rank mesh alone (no
        # collective): the model must then come out as eager's
        # (tests/distributed/scenarios.py checks that several ranks raise).
        tdd.materialize_module(model)
        weight = model.weight
        weight = weight.full_tensor() if isinstance(weight, DTensor) else weight
        assert torch.equal(weight, eager.weight)
        return
    with pytest.raises(RecordingError, match=r"broadcast.*src_data_rank=None"):
        distribute_tensor(model.bias, mesh, [Replicate()])
