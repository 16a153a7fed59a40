"""``dcp.load`` into deferred FSDP2 models on 2 gloo ranks (``dcp_load_scenarios.py``).

The loaded model equals eager + ``dcp.load`` bit for bit, the generator ends
where eager's does, and the inits the checkpoint overwrites are never drawn
(also when each local tensor is written by several chunks, resharding); a key
the load leaves out keeps eager's init.
"""

from __future__ import annotations

import os

import dcp_load_scenarios
import pytest
import torch
from _spawn import run_scenarios

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with the gloo backend",
)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, list[str]]:
    os.environ["TORCHDEFER_TEST_CHECKPOINTS"] = str(tmp_path_factory.mktemp("dcp"))
    try:
        return run_scenarios(2, dcp_load_scenarios.ALL, tmp_path_factory.mktemp("world2"),
                             module="dcp_load_scenarios")
    finally:
        del os.environ["TORCHDEFER_TEST_CHECKPOINTS"]


@pytest.mark.parametrize("scenario", dcp_load_scenarios.ALL)
def test_dcp_load_into_a_deferred_fsdp2_model(outcomes, scenario):
    assert not outcomes[scenario], "\n".join(outcomes[scenario])
