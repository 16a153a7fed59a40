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
from torchdefer.errors import RecordingError
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


def _aten_overloads():
    for full in sorted(torch._C._dispatch_get_all_op_names()):
        namespace, _, name = full.partition("::")
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet, None), overload or "default", None)
        if namespace == "aten" and isinstance(op, torch._ops.OpOverload):
            yield op


# Overloads that take running statistics or a dropout state and only read them.
_READERS = ("backward", "no_update", "no_training", "functional")


def test_every_overload_with_an_unannotated_state_argument_is_listed_or_a_reader():
    """The ``.out`` overloads write the running statistics as the functional ones do
    (``native_batch_norm.out`` was once missing: its statistics replayed stale)."""
    missing = []
    for op in _aten_overloads():
        for a in op._schema.arguments:
            if a.name not in ("running_mean", "running_var", "dropout_state"):
                continue
            if a.alias_info is not None and a.alias_info.is_write:
                continue  # declared: the schema says it
            if op not in UNANNOTATED_WRITES and not any(r in str(op) for r in _READERS):
                missing.append(str(op))
    assert not missing, f"add these to UNANNOTATED_WRITES, or to _READERS if they only read: {missing}"


def test_the_out_overload_of_native_batch_norm_updates_the_running_stats_as_eager():
    def build():
        x, mean, var = torch.randn(4, 3), torch.zeros(3), torch.ones(3)
        out, save_mean, save_invstd = torch.empty(4, 3), torch.empty(3), torch.empty(3)
        torch.ops.aten.native_batch_norm.out(x, None, None, mean, var, True, 0.1, 1e-5,
                                             out=out, save_mean=save_mean, save_invstd=save_invstd)
        return mean, var, out, save_mean, save_invstd

    eager, deferred = build_both(build)
    for i in range(len(eager)):
        assert_same_tensor(torchdefer.materialize_tensor(deferred[i]), eager[i], f"output {i}")


def _fuzz_20261212():
    """Fuzz seed 20261212: running_mean is a view of the input's own storage."""
    t3 = F.batch_norm(torch.eye(5), torch.zeros(5), torch.ones(5), training=True)
    t9 = t3[1].view(-1)
    return F.batch_norm(t3.t(), t9, t9.abs() + 1, training=True, momentum=0.3)


def _stats_are_the_input():
    x = torch.randn(3, 3)
    return F.batch_norm(x, x[1], torch.ones(3), training=True)


def _stats_are_one_tensor():
    s = torch.ones(3)
    return F.batch_norm(torch.randn(4, 3), s, s, training=True)


def _weight_is_the_running_mean():
    s = torch.ones(3)
    return F.batch_norm(torch.randn(4, 3), s, torch.ones(3), weight=s, training=True)


def _bias_overlaps_the_running_var():
    buf = torch.ones(5)
    return F.batch_norm(torch.randn(4, 3), torch.zeros(3), buf[:3], bias=buf[2:], training=True)


def _native_out_overload():
    x = torch.randn(3, 3)
    out, a, b = torch.empty(3, 3), torch.empty(3), torch.empty(3)
    return torch.ops.aten.native_batch_norm.out(x, None, None, x[0], torch.ones(3), True, 0.1,
                                                1e-5, out=out, save_mean=a, save_invstd=b)


def _legit_declared_write():
    x = torch.randn(3, 3) + 2
    return torch.ops.aten._native_batch_norm_legit(x.t(), None, None, x[1], torch.ones(3), True,
                                                   0.3, 1e-5)


@pytest.mark.parametrize("build,written,read", [
    (_fuzz_20261212, "running_mean", "input"),
    (_stats_are_the_input, "running_mean", "input"),
    (_stats_are_one_tensor, "running_mean", "running_var"),
    (_weight_is_the_running_mean, "running_mean", "weight"),
    (_bias_overlaps_the_running_var, "running_var", "bias"),
    (_native_out_overload, "running_mean", "input"),
    (_legit_declared_write, "running_mean", "input"),
], ids=lambda v: getattr(v, "__name__", None))
def test_a_write_into_memory_another_argument_reads_is_refused_at_the_call(build, written, read):
    """Eager's kernel reads the input after it updated the running statistics (or
    not, by layout and device): replay gave other values with no error (fuzz seed
    20261212). Refused at the call, naming both arguments."""
    build()  # eager runs it
    with pytest.raises(RecordingError,
                       match=rf"writes its argument '{written}' in place.*reading its argument "
                             rf"'{read}', which shares memory with it.*\.clone\(\)"):
        torchdefer.deferred_init(build)


@pytest.mark.parametrize("columns", [False, True], ids=["rows", "interleaved"])
def test_running_stats_sharing_a_storage_without_overlap_match_eager(columns):
    """One buffer holding both statistics (a flat parameter store): no element shared."""
    def build():
        stats = torch.zeros(3, 2) if columns else torch.zeros(2, 3)
        mean, var = (stats[:, 0], stats[:, 1]) if columns else (stats[0], stats[1])
        var.fill_(1)
        y = F.batch_norm(torch.randn(4, 3), mean, var, training=True, momentum=0.3)
        return stats, y

    eager, deferred = build_both(build)
    for i in range(len(eager)):
        assert_same_tensor(torchdefer.materialize_tensor(deferred[i]), eager[i], f"output {i}")
