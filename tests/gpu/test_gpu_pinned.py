"""On a GPU host: deferred tensors pin where eager pins, and materialize page-locked.

Skipped without CUDA (``tests/materialize/test_pinned.py`` runs the same paths
on a simulated accelerator host, and checks the refusals of a CPU-only host).
"""

from __future__ import annotations

import pytest
import torch

import torchdefer
from torchdefer.distributed.shard import replay_local

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _both(build):
    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    return eager, torchdefer.deferred_init(build)


@pytest.mark.parametrize("build", [
    lambda: torch.randn(6, 4)[1:4].t().pin_memory(),
    lambda: torch.randn(6, 4, device="cuda").cpu().pin_memory(),
    lambda: torch.zeros(5, pin_memory=True),
    lambda: torch.randn(7, pin_memory=True),
], ids=["view", "from_cuda", "zeros", "randn"])
def test_a_pinned_tensor_materializes_pinned_with_eagers_values(build):
    eager, deferred = _both(build)
    assert eager.is_pinned() and deferred.is_pinned()
    real = torchdefer.materialize_tensor(deferred)
    assert real.is_pinned() and real.untyped_storage().is_pinned()
    assert torch.equal(real, eager) and real.stride() == eager.stride()


def test_row_replay_of_a_pinned_padded_shard_is_pinned():
    def build():
        w = torch.randn(8, 4)
        flat = w.new_zeros(4, 4)
        flat.narrow(0, 0, 3).copy_(w[4:7])
        return flat.pin_memory()

    eager, deferred = _both(build)
    real = replay_local([deferred], "shard")[0]
    assert real.is_pinned() and torch.equal(real, eager)


def test_pinning_a_cuda_tensor_is_refused_as_eager():
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.zeros(3, device="cuda").pin_memory()
    with pytest.raises(torchdefer.TorchdeferError, match="only dense CPU tensors can be pinned"):
        torchdefer.deferred_init(lambda: torch.zeros(3, device="cuda").pin_memory())
