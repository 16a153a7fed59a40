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


FRESH_PROCESS = """
import torch, torchdefer
assert not torch.cuda.is_initialized()
def build():
    return torch.randn(5, device="cuda:0"), torch.rand(3, device="cuda:0")
torch.manual_seed(3)
lazy = torchdefer.deferred_init(build)
after = torch.rand(2, device="cuda:0")
torch.manual_seed(3)
eager = build()
assert torch.equal(torch.rand(2, device="cuda:0"), after)
for t, ref in zip(lazy, eager):
    assert torch.equal(torchdefer.materialize_tensor(t), ref)
print("ok")
"""


def test_a_first_draw_on_cuda_0_in_a_fresh_process_records_and_replays_like_eager():
    # torch.cuda.default_generators is empty until CUDA is initialized; recording
    # "cuda:0" (an index, so no current_device() call) found no generator there.
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
