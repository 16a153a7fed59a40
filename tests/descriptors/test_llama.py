"""A 2-layer Hugging Face Llama with input_ids of shape ["b", "s"], on both backends.

TorchScript cannot script Llama, so backend="jit" runs the validated trace
fallback (torchdefer.descriptors.jit_trace); it traces with (b, s) = (3, 4)
and validates with (5, 6), so the lengths called below are all new to it.
"""

import pytest
import torch

import torchdefer
from torchdefer.descriptors import DescriptorMismatch, MetaTensorType

transformers = pytest.importorskip("transformers")


def tiny_llama():
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


IDS = {
    "input_ids": MetaTensorType(["b", "s"], torch.long, dim_ranges={"s": (1, 128)}),
    "use_cache": False,
}


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def export_program(model):
    return torchdefer.script(model, IDS)


@pytest.fixture(scope="module")
def jit_program(model):
    return torchdefer.script(model, IDS, backend="jit")


@pytest.fixture(params=["export", "jit"])
def llama_and_program(request, model):
    return model, request.getfixturevalue(f"{request.param}_program")


def test_llama_program_matches_eager_for_several_batch_and_sequence_lengths(llama_and_program):
    model, p = llama_and_program
    for b, s in [(1, 1), (1, 4), (2, 7), (2, 9), (3, 2), (3, 16)]:
        ids = torch.randint(0, 64, (b, s))
        with torch.no_grad():
            torch.testing.assert_close(
                p(ids, use_cache=False).logits, model(ids, use_cache=False).logits
            )


def test_llama_output_descriptors_propagate_b_and_s(llama_and_program):
    _, p = llama_and_program
    logits = p.output_descriptors.logits
    assert logits.shape == ("b", "s", 64)
    assert logits.ranges == {"s": (1, 128)}


def test_llama_program_rejects_float_ids_and_overlong_sequences(llama_and_program):
    _, p = llama_and_program
    with pytest.raises(DescriptorMismatch, match="input_ids.dtype: expected torch.int64"):
        p(torch.zeros(1, 4), use_cache=False)
    with pytest.raises(DescriptorMismatch, match=r"expected 's' in \[1, 128\], got 129"):
        p(torch.zeros(1, 129, dtype=torch.long), use_cache=False)


def test_llama_program_round_trips_through_save_and_load(llama_and_program, tmp_path):
    model, p = llama_and_program
    torchdefer.save(p, tmp_path / "llama.tdp")
    q = torchdefer.load(tmp_path / "llama.tdp")
    assert q.backend == p.backend
    assert q.output_descriptors.logits.shape == ("b", "s", 64)
    with pytest.raises(DescriptorMismatch, match="input_ids.dtype: expected torch.int64"):
        q(torch.zeros(1, 4), use_cache=False)
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(
            q(ids, use_cache=False).logits, model(ids, use_cache=False).logits
        )


def test_llama_program_returns_the_models_output_type(llama_and_program):
    model, p = llama_and_program
    ids = torch.zeros(2, 3, dtype=torch.long)
    with torch.no_grad():
        assert type(p(ids, use_cache=False)) is type(model(ids, use_cache=False))


def test_llama_jit_graph_takes_input_ids_with_the_refined_type(jit_program):
    inputs = jit_program.graph.split("):")[0]
    assert "%input_ids : Long(*, *)" in inputs
    assert "use_cache" not in inputs  # value-specialized: closed over, not an input
