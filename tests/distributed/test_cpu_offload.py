"""FSDP2 ``CPUOffloadPolicy`` on deferred models, on 2 gloo ranks (``offload_scenarios.py``).

Without pinning the materialized shards and a training step equal eager's bit
for bit; with pinning, deferral fails where and as eager fails on a host
without an accelerator (and matches it where eager pins), and the pinned path
is run on a simulated accelerator host. A real GPU pins in ``tests/gpu``.
"""

from __future__ import annotations

import os

import offload_scenarios
import pytest
import torch
from _spawn import run_scenarios

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with the gloo backend",
)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, list[str]]:
    os.environ["TORCHDEFER_TEST_CHECKPOINTS"] = str(tmp_path_factory.mktemp("checkpoints"))
    try:
        return run_scenarios(2, offload_scenarios.ALL, tmp_path_factory.mktemp("offload"),
                             module="offload_scenarios")
    finally:
        del os.environ["TORCHDEFER_TEST_CHECKPOINTS"]


@pytest.mark.parametrize("scenario", offload_scenarios.ALL)
def test_fsdp2_cpu_offload_of_a_deferred_model_behaves_as_eager(outcomes, scenario):
    assert not outcomes[scenario], "\n".join(outcomes[scenario])
