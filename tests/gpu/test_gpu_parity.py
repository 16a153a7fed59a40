"""On a GPU: the CUDA offset model against the device, and eager vs deferred end to end.

Skipped without CUDA. ``make test-gpu`` runs these with the other CUDA tests,
then ``gpu_probe.py`` for the full table.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def device():
    return torch.device("cuda", torch.cuda.current_device())


def test_every_counted_row_moves_the_generator_as_predicted(device):
    import gpu_probe

    from torchdefer.rng.philox import DeviceShape

    table, wrong = gpu_probe.probe_table(device, DeviceShape.of(device), quick=True)
    assert wrong == 0, "\n".join(row for row in table if "≠" in row)


def test_eager_and_deferred_agree_bit_for_bit_in_every_order(device):
    import gpu_e2e

    failed = [check for check in gpu_e2e.run_all(device) if not check[1]]
    assert not failed, failed
