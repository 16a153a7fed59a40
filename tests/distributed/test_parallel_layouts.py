"""HSDP, TP and TP+FSDP2 on 4 gloo ranks: bit for bit eager's, no parameter built whole.

``RowwiseParallel`` shards columns (``Shard(1)``); those shards, and the FSDP2
shards of them, come from chunks of whole rows (``distributed/_columns.py``)
rather than from the whole parameter. See ``parallel_scenarios.py``.
"""

from __future__ import annotations

import parallel_scenarios
import pytest
import torch
from _spawn import run_scenarios

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with the gloo backend",
)

WORLD = 4  # the 2 x 2 meshes of HSDP and TP+FSDP2


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, list[str]]:
    """One spawn runs every scenario (process start-up dominates)."""
    return run_scenarios(WORLD, parallel_scenarios.ALL, tmp_path_factory.mktemp("parallel"),
                         module="parallel_scenarios")  # fmt: skip


def _check(outcomes, name: str) -> None:
    errors = outcomes[name]
    assert not errors, "\n".join(errors)


def test_tensor_parallel_peak_memory_is_the_shards_and_one_chunk(outcomes):
    _check(outcomes, "tensor_parallel_peak_memory_is_the_shards_and_a_chunk")


def test_hsdp_on_a_2x2_mesh_matches_eager_from_rows(outcomes):
    _check(outcomes, "hsdp_matches_eager_from_rows")


def test_tensor_parallel_plan_matches_eager_with_rowwise_from_row_chunks(outcomes):
    _check(outcomes, "tensor_parallel_matches_eager_with_rowwise_from_row_chunks")


def test_tensor_parallel_with_fsdp2_on_a_2x2_mesh_matches_eager(outcomes):
    _check(outcomes, "tensor_parallel_and_fsdp2_match_eager_with_rowwise_from_row_chunks")
