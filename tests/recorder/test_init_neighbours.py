"""The other data-dependent-looking inits: exact by recording op by op, nothing run at deferral.

timm's ``trunc_normal_``/``trunc_normal_tf_`` (erfinv of a uniform, then a
clamp: elementwise, no data read), ``nn.init.sparse_`` (``randperm`` per
column, indices used as tensors, never read in Python) and ``orthogonal_``
(QR of a normal matrix) are recorded op by op: every draw is in the draw
model, so leaving ``deferred_init`` runs nothing.
"""

import math

import pytest
import torch
from torch import nn

import torchdefer
from parity import check_program
from torchdefer._hooks import CALL_RUNNER
from torchdefer.recorder._composite import Composite


# timm.layers.weight_init (timm is not installed here), as written there.
def _timm_trunc_normal(tensor, mean, std, a, b):
    def norm_cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    low = norm_cdf((a - mean) / std)
    up = norm_cdf((b - mean) / std)
    tensor.uniform_(2 * low - 1, 2 * up - 1)
    tensor.erfinv_()
    tensor.mul_(std * math.sqrt(2.0))
    tensor.add_(mean)
    tensor.clamp_(min=a, max=b)
    return tensor


def timm_trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0):
    with torch.no_grad():
        return _timm_trunc_normal(tensor, mean, std, a, b)


def timm_trunc_normal_tf_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0):
    with torch.no_grad():
        _timm_trunc_normal(tensor, 0, 1.0, a, b)
        tensor.mul_(std).add_(mean)
    return tensor


INITS = {
    "timm trunc_normal_": lambda w: timm_trunc_normal_(w, std=0.02),
    "timm trunc_normal_tf_": lambda w: timm_trunc_normal_tf_(w, std=0.02, a=-0.04, b=0.04),
    "sparse_": lambda w: nn.init.sparse_(w, sparsity=0.3, std=0.02),
    "sparse_ with a generator": lambda w: nn.init.sparse_(
        w, sparsity=0.5, generator=torch.Generator().manual_seed(1)
    ),
    "orthogonal_": lambda w: nn.init.orthogonal_(w, gain=0.5),
}


@pytest.mark.parametrize("name", sorted(INITS))
def test_neighbour_inits_match_eager_and_run_nothing_at_deferral(name):
    def build():
        w = torch.empty(24, 10)
        INITS[name](w)
        return w, torch.randn(5)

    def refuse(node, state, model):
        raise AssertionError(f"{node.name} ran to learn its draws")

    torch.manual_seed(0)
    with CALL_RUNNER.replaced(refuse):
        w, after = torchdefer.deferred_init(build)
    assert not w._graph.observations  # no data was read to record it
    random_calls = [n for s in w._graph.rng.streams.values() for e in s.epochs for n in e.calls]
    assert random_calls and not any(isinstance(n.op, Composite) for n in random_calls)
    check_program(lambda defer: defer(build), order=[1, 0])
