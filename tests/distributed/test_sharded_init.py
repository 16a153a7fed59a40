"""Deferred modules sharded by FSDP2, DTensor and FSDP1 on 1, 2 and 4 CPU ranks (gloo).

Each rank builds the model with the same seed and compares its local shards
and the gathered tensors with the model built eagerly (see ``scenarios.py``).
Passing at every world size is the promise that the global model does not
depend on the world size.
"""

from __future__ import annotations

import pytest
import scenarios
import torch
from _spawn import GLOO_AVG_SUMS, run_scenarios

pytest.importorskip("transformers")

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with the gloo backend",
)

WORLD_SIZES = [1, 2, 4]
# FSDP1 falls back to NO_SHARD on one rank: nothing sharded to compare.
FSDP1 = {"fsdp1_param_init_fn_matches_eager", "fsdp1_without_param_init_fn_matches_eager"}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[int, dict[str, list[str]]]:
    """One spawn per world size runs every scenario (process start-up dominates)."""
    results = {}
    for world in WORLD_SIZES:
        names = [n for n in scenarios.ALL if world > 1 or n not in FSDP1]
        results[world] = run_scenarios(world, names, tmp_path_factory.mktemp(f"world{world}"))
    return results


def _check(outcomes, world: int, name: str) -> None:
    errors = outcomes[world][name]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_fsdp2_shards_of_torch_nn_models_are_slices_of_eager(outcomes, world):
    _check(outcomes, world, "fsdp2_torch_nn_models_match_eager")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_fsdp2_shards_of_hf_models_are_slices_of_eager(outcomes, world):
    _check(outcomes, world, "fsdp2_hf_models_match_eager")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_fsdp2_forward_backward_and_step_match_eager(outcomes, world):
    if outcomes[world][GLOO_AVG_SUMS]:
        seen = outcomes[world][GLOO_AVG_SUMS][0].splitlines()[-1]
        pytest.skip(
            "torch bug: gloo's reduce_scatter sums for ReduceOp.AVG, so FSDP2 steps by "
            f"world_size x the averaged gradient, eager-built models too: {seen}"
        )
    _check(outcomes, world, "fsdp2_training_step_matches_eager")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_fsdp2_peak_memory_is_shards_plus_about_one_parameter(outcomes, world):
    _check(outcomes, world, "fsdp2_peak_memory_is_shards_plus_one_parameter")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_materialize_dtensor_matches_distributing_the_eager_tensor(outcomes, world):
    _check(outcomes, world, "dtensor_placements_match_eager")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_tensor_parallel_deferred_module_matches_eager(outcomes, world):
    _check(outcomes, world, "tensor_parallel_module_matches_eager")


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_tensor_parallel_with_default_src_data_rank_raises_on_every_rank(outcomes, world):
    _check(outcomes, world, "tensor_parallel_default_src_data_rank_raises_with_the_fix")


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp1_param_init_fn_gives_the_shards_of_the_eager_model(outcomes, world):
    _check(outcomes, world, "fsdp1_param_init_fn_matches_eager")


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp1_without_param_init_fn_materializes_like_torchdistx(outcomes, world):
    _check(outcomes, world, "fsdp1_without_param_init_fn_matches_eager")
