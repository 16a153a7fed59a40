"""A sharded load is all or nothing on every rank: one rank failing, anywhere, makes
every rank refuse and leaves every rank's model as it was (see
``atomic_checkpoint_scenarios.py``); a good load afterwards matches eager."""

from __future__ import annotations

import os

import atomic_checkpoint_scenarios as scenarios
import pytest
import torch
from _spawn import run_scenarios

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with the gloo backend",
)


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def outcomes(request, tmp_path_factory) -> dict[str, list[str]]:
    os.environ["TORCHDEFER_TEST_CHECKPOINTS"] = str(tmp_path_factory.mktemp("checkpoints"))
    try:
        return run_scenarios(request.param, scenarios.ALL,
                             tmp_path_factory.mktemp(f"world{request.param}"),
                             module="atomic_checkpoint_scenarios")
    finally:
        del os.environ["TORCHDEFER_TEST_CHECKPOINTS"]


def _passed(outcomes, name: str) -> None:
    assert not outcomes[name], "\n".join(outcomes[name])


def test_one_rank_failing_while_loading_a_state_dict_changes_no_rank(outcomes):
    _passed(outcomes, "a_failure_on_one_rank_leaves_every_rank_unchanged_full_source")


def test_one_rank_failing_while_loading_a_dcp_checkpoint_changes_no_rank(outcomes):
    _passed(outcomes, "a_failure_on_one_rank_leaves_every_rank_unchanged_dcp_source")


def test_one_rank_failing_leaves_real_plain_tensors_unchanged_on_every_rank(outcomes):
    _passed(outcomes, "a_failure_on_one_rank_leaves_real_plain_tensors_unchanged")


def test_a_materialized_sharded_model_is_refused_with_what_to_use_instead(outcomes):
    _passed(outcomes, "a_materialized_sharded_model_is_refused_unchanged")
