"""examples/fsdp_llama.py runs as documented (torchrun, 2 ranks, CPU/gloo), so it cannot rot."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")
def test_fsdp_llama_example_checks_every_shard_against_eager_on_two_ranks():
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        str(ROOT / "examples" / "fsdp_llama.py"), "--layers", "2", "--hidden", "64",
        "--vocab", "256",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert f"rank {rank}: all 21 local shards equal the eager model's slices" in done.stdout
        assert f"rank {rank}/2: model" in done.stdout
    assert "forward, backward and an optimizer step ran" in done.stdout
