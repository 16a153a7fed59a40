"""A 2-layer Hugging Face Llama with input_ids of shape ["b", "s"]."""

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
def llama_and_program():
    model = tiny_llama()
    return model, torchdefer.script(model, IDS)


def test_llama_program_matches_eager_for_several_batch_and_sequence_lengths(llama_and_program):
    model, p = llama_and_program
    for b, s in [(1, 1), (2, 7), (3, 16)]:
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
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(
            q(ids, use_cache=False).logits, model(ids, use_cache=False).logits
        )


def test_llama_jit_backend_reports_that_torchscript_cannot_compile_it():
    with pytest.raises(TypeError, match="torch.jit.script cannot compile .* use backend='export'"):
        torchdefer.script(tiny_llama(), IDS, backend="jit")
