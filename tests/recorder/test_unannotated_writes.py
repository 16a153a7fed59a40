"""Ops that update inputs their schema does not mark as written (batch norm's running stats).

A forward pass run while building ("dry run to infer a size") updates the
running statistics of every batch-norm layer in training mode; the deferred
model must come out with eager's statistics.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdefer
from parity import assert_same_module, assert_same_tensor, build_both, check_module_parity
from torchdefer.recorder._alias import UNANNOTATED_WRITES


class InferSize(nn.Module):
    """The classic CNN that sizes its classifier with a forward pass."""

    def __init__(self, norm):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3), norm(8), nn.ReLU(), nn.Conv2d(8, 4, 3), norm(4))
        with torch.no_grad():
            n = self.features(torch.randn(2, 3, 12, 12)).flatten(1).shape[1]
        self.head = nn.Linear(n, 10)


@pytest.mark.parametrize(
    "norm",
    [
        nn.BatchNorm2d,
        lambda c: nn.BatchNorm2d(c, momentum=None),  # cumulative average: num_batches_tracked
        lambda c: nn.InstanceNorm2d(c, affine=True, track_running_stats=True),
        lambda c: nn.GroupNorm(2, c),
    ],
    ids=["batchnorm", "batchnorm_cumulative", "instancenorm_tracked", "groupnorm"],
)
def test_a_dry_run_forward_while_building_updates_running_stats_as_eager(norm):
    check_module_parity(InferSize, norm)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_several_forwards_in_train_then_eval_mode_match_eager(dims):
    def build():
        bn = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dims](4)
        shape = (3, 4) + (5,) * dims
        for _ in range(3):
            bn(torch.randn(shape))
        bn.eval()
        bn(torch.randn(shape))  # eval: the statistics are read, not updated
        return bn

    check_module_parity(build)


def test_functional_batch_norm_writes_its_running_buffers_in_training_only():
    def build():
        mean, var = torch.zeros(3), torch.ones(3)
        x = torch.randn(4, 3)
        y = F.batch_norm(x, mean, var, training=True, momentum=0.3)
        m2, v2 = torch.rand(3), torch.rand(3) + 1
        out, save_mean, save_invstd = torch.native_batch_norm(x, None, None, m2, v2, True, 0.5, 1e-5)
        z = torch.native_batch_norm(x, None, None, m2, v2, False, 0.1, 1e-5)[0]  # eval: reads
        return mean, var, y, m2, v2, out, save_mean, save_invstd, z

    eager, deferred = build_both(build)
    for i in reversed(range(len(eager))):
        assert_same_tensor(torchdefer.materialize_tensor(deferred[i]), eager[i], f"output {i}")


def test_running_stats_updated_after_deferred_init_returns_match_eager():
    def forward(m):
        m.train()
        m(torch.randn(4, 3, 6, 6))
        return m

    torch.manual_seed(0)
    eager = forward(nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)))
    torch.manual_seed(0)
    deferred = forward(torchdefer.deferred_init(nn.Sequential, nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)))
    torchdefer.materialize_module(deferred)
    assert_same_module(deferred, eager)


@pytest.mark.parametrize("op", sorted(UNANNOTATED_WRITES, key=str), ids=str)
def test_each_listed_hidden_write_is_still_an_unannotated_state_argument(op):
    indices, _ = UNANNOTATED_WRITES[op]
    arguments = op._schema.arguments
    for i in indices:
        assert arguments[i].name in ("running_mean", "running_var", "dropout_state"), (op, i)
        assert arguments[i].alias_info is None or not arguments[i].alias_info.is_write


@torch.library.custom_op("torchdefer_test::scale_and_bump", mutates_args=())
def _scale_and_bump(x: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    counter.add_(1)  # a write its registration does not declare
    return x * 2


@_scale_and_bump.register_fake
def _(x, counter):
    return torch.empty_like(x)


def test_an_op_writing_an_input_it_does_not_declare_is_refused_at_replay():
    def build():
        counter = torch.zeros(1)
        return _scale_and_bump(torch.ones(3), counter), counter

    out, _ = torchdefer.deferred_init(build)
    with pytest.raises(torchdefer.materialize.ReplayError, match=r"scale_and_bump.*'counter'.*mutates_args"):
        torchdefer.materialize_tensor(out)
