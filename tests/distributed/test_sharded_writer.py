"""``save_state_dict(format="dcp")`` of sharded deferred models on 2 and 4 gloo ranks
(``writer_scenarios.py``).

Every rank writes its own shards, no rank holds the model, and ``dcp.load``
reads the checkpoint back as eager construction, unsharded (a torchtitan seed
checkpoint) or resharded; safetensors is refused with what to do, and a
destination that is taken is refused on every rank.
"""

from __future__ import annotations

import os

import pytest
import torch
import writer_scenarios
from _spawn import run_scenarios

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with the gloo backend",
)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, list[str]]:
    os.environ["TORCHDEFER_TEST_CHECKPOINTS"] = str(tmp_path_factory.mktemp("written"))
    try:
        return run_scenarios(2, writer_scenarios.ALL, tmp_path_factory.mktemp("world2"),
                             module="writer_scenarios")
    finally:
        del os.environ["TORCHDEFER_TEST_CHECKPOINTS"]


@pytest.fixture(scope="module")
def outcomes_on_four(tmp_path_factory) -> dict[str, list[str]]:
    os.environ["TORCHDEFER_TEST_CHECKPOINTS"] = str(tmp_path_factory.mktemp("written4"))
    try:
        return run_scenarios(4, writer_scenarios.FOUR, tmp_path_factory.mktemp("world4"),
                             module="writer_scenarios")
    finally:
        del os.environ["TORCHDEFER_TEST_CHECKPOINTS"]


@pytest.mark.parametrize("scenario", writer_scenarios.ALL)
def test_a_sharded_deferred_model_is_written_by_every_rank(outcomes, scenario):
    assert not outcomes[scenario], "\n".join(outcomes[scenario])


@pytest.mark.parametrize("scenario", writer_scenarios.FOUR)
def test_a_model_on_a_two_by_two_mesh_is_written_by_every_rank(outcomes_on_four, scenario):
    assert not outcomes_on_four[scenario], "\n".join(outcomes_on_four[scenario])
