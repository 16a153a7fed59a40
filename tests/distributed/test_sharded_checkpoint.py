"""torchdefer.load_state_dict into FSDP2-sharded deferred models on 2 gloo ranks.

The scenarios (``checkpoint_scenarios.py``) load a ``torch.distributed.checkpoint``
saved from a sharded model and a Hugging Face safetensors directory, each with
the same seed on every rank, and compare the gathered parameters, buffers and
a forward pass with the eager model loaded by ``Module.load_state_dict``.
"""

from __future__ import annotations

import os

import checkpoint_scenarios
import pytest
import torch
from _spawn import run_scenarios

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with the gloo backend",
)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, list[str]]:
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    os.environ["TORCHDEFER_TEST_CHECKPOINTS"] = str(checkpoints)
    try:
        return run_scenarios(2, checkpoint_scenarios.ALL, tmp_path_factory.mktemp("world2"),
                             module="checkpoint_scenarios")
    finally:
        del os.environ["TORCHDEFER_TEST_CHECKPOINTS"]


def test_a_dcp_checkpoint_loads_into_an_fsdp2_deferred_model(outcomes):
    assert not outcomes["dcp_checkpoint_into_fsdp2_model_matches_eager"], "\n".join(
        outcomes["dcp_checkpoint_into_fsdp2_model_matches_eager"])


def test_a_safetensors_checkpoint_loads_into_an_fsdp2_deferred_model(outcomes):
    assert not outcomes["safetensors_into_fsdp2_model_matches_eager"], "\n".join(
        outcomes["safetensors_into_fsdp2_model_matches_eager"])


def test_a_failed_load_into_an_fsdp2_deferred_model_changes_nothing(outcomes):
    assert not outcomes["a_failed_load_into_fsdp2_model_changes_nothing"], "\n".join(
        outcomes["a_failed_load_into_fsdp2_model_changes_nothing"])


def test_tied_names_in_a_dcp_checkpoint_are_all_read_and_compared_on_every_rank(outcomes):
    name = "tied_names_in_a_dcp_checkpoint_are_all_read_and_compared"
    assert not outcomes[name], "\n".join(outcomes[name])


def test_a_loaded_buffer_never_shares_a_real_module_tensors_storage(outcomes):
    name = "a_loaded_buffer_never_shares_a_real_module_tensors_storage"
    assert not outcomes[name], "\n".join(outcomes[name])
