"""Hugging Face transformers models from small configs, built eagerly and deferred."""

import pytest
import torch

from parity import check_module_parity

transformers = pytest.importorskip("transformers")

MODELS = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
        bos_token_id=0, eos_token_id=0)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100)),
    "bert": lambda: transformers.BertModel(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        vocab_size=100)),
    "t5": lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        num_layers=2, d_model=32, d_ff=64, num_heads=2, d_kv=16, vocab_size=100)),
    "mixtral": lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, num_local_experts=4)),
    "mamba": lambda: transformers.MambaForCausalLM(transformers.MambaConfig(
        num_hidden_layers=2, hidden_size=32, vocab_size=100, state_size=8)),
    "vit": lambda: transformers.ViTModel(transformers.ViTConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        image_size=32, patch_size=8)),
    # stochastic depth: drop-path rates come from torch.linspace(...).item()
    "convnext_drop_path": lambda: transformers.ConvNextModel(transformers.ConvNextConfig(
        depths=[1, 1, 2, 1], hidden_sizes=[8, 16, 32, 64], drop_path_rate=0.2)),
    "swin_drop_path": lambda: transformers.SwinModel(transformers.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 2], num_heads=[1, 2],
        window_size=2, drop_path_rate=0.1)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_model_matches_eager_bitwise(name):
    model = check_module_parity(MODELS[name])
    if name == "llama":  # and it runs
        ids = torch.randint(0, 100, (1, 5))
        assert model(input_ids=ids).logits.shape == (1, 5, 100)


def test_hf_from_config_with_torch_dtype_matches_eager():
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100)
    model = check_module_parity(
        lambda: transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16))
    assert model.lm_head.weight.dtype == torch.bfloat16
