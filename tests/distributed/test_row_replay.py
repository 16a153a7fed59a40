"""Each rank makes its shards from its own rows: FSDP2, HSDP, TP, pipeline stages on 1, 2, 4 ranks.

Every local shard is compared with the slice of the eagerly built parameter,
bit for bit, and the path is checked: parameters whose history allows it come
from the rank's own rows (drawing about what the shard holds, never holding a
full parameter), the others fall back to the full parameter and stay right
(see ``row_scenarios.py``).
"""

from __future__ import annotations

import pytest
import row_scenarios
import torch
from _spawn import run_scenarios

pytest.importorskip("transformers")

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with the gloo backend",
)

WORLD_SIZES = [1, 2, 4]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[int, dict[str, list[str]]]:
    """One spawn per world size runs every scenario (process start-up dominates)."""
    return {
        world: run_scenarios(world, row_scenarios.ALL, tmp_path_factory.mktemp(f"rows{world}"),
                             module="row_scenarios")
        for world in WORLD_SIZES
    }


def _check(outcomes, world: int, name: str) -> None:
    errors = outcomes[world][name]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_fsdp2_shards_come_from_their_own_rows_bit_for_bit(outcomes, world):
    _check(outcomes, world, "fsdp2_shards_come_from_their_own_rows")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_fsdp2_parameters_whose_init_mixes_elements_fall_back_bit_for_bit(outcomes, world):
    _check(outcomes, world, "fsdp2_mixing_init_falls_back_and_stays_bit_for_bit")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_fsdp2_model_converted_to_bf16_after_init_comes_from_rows(outcomes, world):
    _check(outcomes, world, "fsdp2_bf16_model_converted_after_init_matches_eager")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_fsdp2_row_path_never_holds_a_full_parameter(outcomes, world):
    _check(outcomes, world, "fsdp2_row_path_peak_memory_is_the_shards")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_hsdp_shards_come_from_their_own_rows_bit_for_bit(outcomes, world):
    _check(outcomes, world, "hsdp_shards_come_from_their_own_rows")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_tensor_parallel_colwise_takes_rows_and_rowwise_row_chunks_bit_for_bit(outcomes, world):
    _check(outcomes, world, "tensor_parallel_colwise_rows_and_rowwise_columns_match_eager")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_each_pipeline_stage_materializes_its_own_layers_bit_for_bit(outcomes, world):
    _check(outcomes, world, "pipeline_stage_materializes_its_own_layers_bit_for_bit")
