"""Real-model parity sweep: Hugging Face and diffusers models from small configs, bit for bit.

Every architecture is built the way users build one from a config, from the
same seed, eagerly and under ``deferred_init`` (transformers:
``AutoModel*.from_config(config, dtype=...)``, which sets the default dtype
while building; diffusers: ``Model(**config).to(dtype)``), materialized, and
compared parameter by parameter and buffer by buffer (values, dtype, strides,
device, requires_grad, Parameter-ness, tying, shared storage). Configs only:
nothing is downloaded.

``TORCHDEFER_SWEEP_ALL=1`` adds the long profile: every model type transformers
registers, built from its default config shrunk by generic keys, where that
builds eagerly at all and has at most 3M parameters.
"""

import os

import pytest
import torch

from parity import check_module_parity

transformers = pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")
transformers.logging.set_verbosity_error()
diffusers.logging.set_verbosity_error()

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

T = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
         intermediate_size=64, vocab_size=128, max_position_embeddings=64)
ENC = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
           vocab_size=128, max_position_embeddings=64)
S2S = dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
           decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=128,
           max_position_embeddings=64)
VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
           image_size=32, patch_size=8)
MOE = dict(T, num_local_experts=4, num_experts_per_tok=2)
# name: (auto class, model_type, config kwargs)
HF_ARCHS = {
    # decoder LMs
    "llama": ("AutoModelForCausalLM", "llama", T),
    "mistral": ("AutoModelForCausalLM", "mistral", T),
    "qwen2": ("AutoModelForCausalLM", "qwen2", T),
    "qwen3": ("AutoModelForCausalLM", "qwen3", dict(T, head_dim=8)),
    "gemma": ("AutoModelForCausalLM", "gemma", dict(T, head_dim=8)),
    "gemma2": ("AutoModelForCausalLM", "gemma2", dict(T, head_dim=8)),
    "gemma3_text": ("AutoModelForCausalLM", "gemma3_text", dict(T, head_dim=8)),
    "phi": ("AutoModelForCausalLM", "phi", T),
    "phi3": ("AutoModelForCausalLM", "phi3", dict(T, pad_token_id=0)),
    "gpt2": ("AutoModelForCausalLM", "gpt2", dict(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=64)),
    "gpt_neo": ("AutoModelForCausalLM", "gpt_neo", dict(num_layers=2, hidden_size=32, num_heads=4, vocab_size=128, max_position_embeddings=64, attention_types=[[["global", "local"], 1]], window_size=8)),
    "gpt_neox": ("AutoModelForCausalLM", "gpt_neox", T),
    "gptj": ("AutoModelForCausalLM", "gptj", dict(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=64, rotary_dim=4)),
    "opt": ("AutoModelForCausalLM", "opt", dict(T, ffn_dim=64, word_embed_proj_dim=32)),
    "bloom": ("AutoModelForCausalLM", "bloom", dict(n_layer=2, hidden_size=32, n_head=4, vocab_size=128)),
    "falcon": ("AutoModelForCausalLM", "falcon", T),
    "mpt": ("AutoModelForCausalLM", "mpt", dict(d_model=32, n_heads=4, n_layers=2, vocab_size=128, max_seq_len=64)),
    "starcoder2": ("AutoModelForCausalLM", "starcoder2", T),
    "olmo2": ("AutoModelForCausalLM", "olmo2", T),
    "cohere": ("AutoModelForCausalLM", "cohere", T),
    "stablelm": ("AutoModelForCausalLM", "stablelm", T),
    "codegen": ("AutoModelForCausalLM", "codegen", dict(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=64, rotary_dim=4)),
    "biogpt": ("AutoModelForCausalLM", "biogpt", ENC),
    "xglm": ("AutoModelForCausalLM", "xglm", dict(d_model=32, num_layers=2, attention_heads=4, ffn_dim=64, vocab_size=128, max_position_embeddings=64)),
    "granite": ("AutoModelForCausalLM", "granite", T),
    "bitnet": ("AutoModelForCausalLM", "bitnet", T),
    "mamba": ("AutoModelForCausalLM", "mamba", dict(num_hidden_layers=2, hidden_size=32, vocab_size=128, state_size=8)),
    "mamba2": ("AutoModelForCausalLM", "mamba2", dict(num_hidden_layers=2, hidden_size=32, vocab_size=128, state_size=8, num_heads=4, head_dim=16, n_groups=1, expand=2)),
    "rwkv": ("AutoModelForCausalLM", "rwkv", dict(num_hidden_layers=2, hidden_size=32, vocab_size=128, attention_hidden_size=32, intermediate_size=64, context_length=64)),
    "recurrent_gemma": ("AutoModelForCausalLM", "recurrent_gemma", dict(T, num_hidden_layers=3, lru_width=32, attention_window_size=8, block_types=["recurrent", "attention"])),
    # MoE
    "mixtral": ("AutoModelForCausalLM", "mixtral", MOE),
    "qwen2_moe": ("AutoModelForCausalLM", "qwen2_moe", dict(T, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)),
    "qwen3_moe": ("AutoModelForCausalLM", "qwen3_moe", dict(T, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    "olmoe": ("AutoModelForCausalLM", "olmoe", dict(T, num_experts=4, num_experts_per_tok=2)),
    "deepseek_v3": ("AutoModelForCausalLM", "deepseek_v3", dict(T, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_group=1, topk_group=1)),
    "granitemoe": ("AutoModelForCausalLM", "granitemoe", MOE),
    "jetmoe": ("AutoModelForCausalLM", "jetmoe", dict(T, num_local_experts=4, num_experts_per_tok=2, kv_channels=8)),
    "jamba": ("AutoModelForCausalLM", "jamba", dict(MOE, num_experts=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=4, use_mamba_kernels=False)),
    "gpt_oss": ("AutoModelForCausalLM", "gpt_oss", dict(T, head_dim=8, num_local_experts=4, num_experts_per_tok=2)),
    # encoders
    "bert": ("AutoModel", "bert", ENC),
    "roberta": ("AutoModel", "roberta", ENC),
    "albert": ("AutoModel", "albert", dict(ENC, embedding_size=16)),
    "distilbert": ("AutoModel", "distilbert", dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=128, max_position_embeddings=64)),
    "electra": ("AutoModel", "electra", dict(ENC, embedding_size=16)),
    "deberta": ("AutoModel", "deberta", ENC),
    "deberta-v2": ("AutoModel", "deberta-v2", ENC),
    "xlm-roberta": ("AutoModel", "xlm-roberta", ENC),
    "mpnet": ("AutoModel", "mpnet", ENC),
    "convbert": ("AutoModel", "convbert", dict(ENC, embedding_size=32)),
    "modernbert": ("AutoModel", "modernbert", dict(ENC, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, global_attn_every_n_layers=2, local_attention=8)),
    "big_bird": ("AutoModel", "big_bird", dict(ENC, attention_type="original_full")),
    "longformer": ("AutoModel", "longformer", dict(ENC, attention_window=8)),
    "esm": ("AutoModel", "esm", dict(ENC, pad_token_id=1)),
    "canine": ("AutoModel", "canine", dict(ENC, num_hash_buckets=64)),
    # encoder-decoder
    "t5": ("AutoModelForSeq2SeqLM", "t5", dict(num_layers=1, d_model=32, d_ff=64, num_heads=2, d_kv=16, vocab_size=128)),
    "mt5": ("AutoModelForSeq2SeqLM", "mt5", dict(num_layers=1, d_model=32, d_ff=64, num_heads=2, d_kv=16, vocab_size=128)),
    "longt5": ("AutoModelForSeq2SeqLM", "longt5", dict(num_layers=1, d_model=32, d_ff=64, num_heads=2, d_kv=16, vocab_size=128)),
    "umt5": ("AutoModelForSeq2SeqLM", "umt5", dict(num_layers=1, d_model=32, d_ff=64, num_heads=2, d_kv=16, vocab_size=128)),
    "switch_transformers": ("AutoModelForSeq2SeqLM", "switch_transformers", dict(num_layers=2, num_decoder_layers=2, d_model=32, d_ff=64, num_heads=2, d_kv=16, vocab_size=128, num_experts=4, encoder_sparse_step=1, decoder_sparse_step=1)),
    "bart": ("AutoModelForSeq2SeqLM", "bart", S2S),
    "mbart": ("AutoModelForSeq2SeqLM", "mbart", S2S),
    "pegasus": ("AutoModelForSeq2SeqLM", "pegasus", S2S),
    "marian": ("AutoModelForSeq2SeqLM", "marian", dict(S2S, decoder_vocab_size=128, pad_token_id=0, decoder_start_token_id=0)),
    "m2m_100": ("AutoModelForSeq2SeqLM", "m2m_100", S2S),
    "blenderbot": ("AutoModelForSeq2SeqLM", "blenderbot", S2S),
    "led": ("AutoModelForSeq2SeqLM", "led", dict(S2S, max_encoder_position_embeddings=64, max_decoder_position_embeddings=64, attention_window=8)),
    "prophetnet": ("AutoModelForSeq2SeqLM", "prophetnet", dict(hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=1, num_decoder_layers=1, num_encoder_attention_heads=2, num_decoder_attention_heads=2, vocab_size=128, max_position_embeddings=64, ngram=2)),
    # vision
    "vit": ("AutoModel", "vit", VIT),
    "deit": ("AutoModel", "deit", VIT),
    "beit": ("AutoModel", "beit", dict(VIT, use_relative_position_bias=True)),
    "dinov2": ("AutoModel", "dinov2", dict(VIT, drop_path_rate=0.1)),
    "swin": ("AutoModel", "swin", dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 2], num_heads=[1, 2], window_size=2, drop_path_rate=0.1)),
    "convnext": ("AutoModel", "convnext", dict(depths=[1, 1, 2, 1], hidden_sizes=[8, 16, 32, 64], drop_path_rate=0.2)),
    "convnextv2": ("AutoModel", "convnextv2", dict(depths=[1, 1, 1, 1], hidden_sizes=[8, 16, 32, 64])),
    "resnet": ("AutoModel", "resnet", dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])),
    "regnet": ("AutoModel", "regnet", dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8)),
    "mobilenet_v2": ("AutoModel", "mobilenet_v2", dict(depth_multiplier=0.25, image_size=32)),
    "efficientnet": ("AutoModel", "efficientnet", dict(width_coefficient=0.1, depth_coefficient=0.1, image_size=32, hidden_dim=64)),
    "segformer": ("AutoModel", "segformer", dict(hidden_sizes=[8, 16], num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], num_attention_heads=[1, 2], decoder_hidden_size=16, drop_path_rate=0.1, patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])),
    "levit": ("AutoModel", "levit", dict(image_size=32, hidden_sizes=[16, 32, 48], num_attention_heads=[1, 2, 3], depths=[1, 1, 1], key_dim=[8, 8, 8])),
    "poolformer": ("AutoModel", "poolformer", dict(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])),
    "mobilevit": ("AutoModel", "mobilevit", dict(image_size=32, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32])),
    "clip": ("AutoModel", "clip", dict(text_config=dict(ENC), vision_config=dict(VIT), projection_dim=16)),
    "siglip": ("AutoModel", "siglip", dict(text_config=dict(ENC), vision_config=dict(VIT))),
    # audio
    "wav2vec2": ("AutoModel", "wav2vec2", dict(ENC, conv_dim=[16, 16], conv_stride=[5, 2], conv_kernel=[10, 3], num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)),
    "hubert": ("AutoModel", "hubert", dict(ENC, conv_dim=[16, 16], conv_stride=[5, 2], conv_kernel=[10, 3], num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)),
    "wavlm": ("AutoModel", "wavlm", dict(ENC, conv_dim=[16, 16], conv_stride=[5, 2], conv_kernel=[10, 3], num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)),
    "whisper": ("AutoModel", "whisper", dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=128, num_mel_bins=16, max_source_positions=32, max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)),
    "speech_to_text": ("AutoModel", "speech_to_text", dict(S2S, input_feat_per_channel=16, conv_channels=16, max_source_positions=64, max_target_positions=64)),
    "audio-spectrogram-transformer": ("AutoModel", "audio-spectrogram-transformer", dict(ENC, num_mel_bins=16, max_length=32, patch_size=8)),
    "encodec": ("AutoModel", "encodec", dict(hidden_size=16, num_filters=4, upsampling_ratios=[2, 2], codebook_size=32, codebook_dim=16, num_lstm_layers=1)),
}

DIFFUSERS_MODELS = {
    "UNet2DModel": dict(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16), down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4, attention_head_dim=4),
    "UNet2DConditionModel": dict(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16, norm_num_groups=4, attention_head_dim=4),
    "UNet1DModel": dict(block_out_channels=(8, 16, 16), in_channels=2, out_channels=2, extra_in_channels=16, layers_per_block=1, down_block_types=("DownBlock1D", "DownBlock1D", "AttnDownBlock1D"), up_block_types=("AttnUpBlock1D", "UpBlock1D", "UpBlock1DNoSkip"), mid_block_type="UNetMidBlock1D", norm_num_groups=4),
    "ControlNetModel": dict(in_channels=4, block_out_channels=(8, 16), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), layers_per_block=1, cross_attention_dim=16, norm_num_groups=4, attention_head_dim=4, conditioning_embedding_out_channels=(4, 8)),
    "AutoencoderKL": dict(in_channels=3, out_channels=3, block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=4, layers_per_block=1),
    "VQModel": dict(in_channels=3, out_channels=3, block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=4, layers_per_block=1, num_vq_embeddings=16, vq_embed_dim=4),
    "AutoencoderTiny": dict(encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8), num_encoder_blocks=(1, 1), num_decoder_blocks=(1, 1), latent_channels=4),
    "DiTTransformer2DModel": dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=10),
    "SD3Transformer2DModel": dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16),
    "FluxTransformer2DModel": dict(patch_size=1, in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=16, axes_dims_rope=(2, 2, 4)),
    "PixArtTransformer2DModel": dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2, sample_size=8, patch_size=2, cross_attention_dim=16, caption_channels=16, norm_num_groups=4),
    "SanaTransformer2DModel": dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1, num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16, caption_channels=16, sample_size=8),
    "HunyuanDiT2DModel": dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, patch_size=2, num_layers=2, sample_size=8, cross_attention_dim=16, cross_attention_dim_t5=16, pooled_projection_dim=16, text_len=4, text_len_t5=4, hidden_size=16),
    "Transformer2DModel": dict(num_attention_heads=2, attention_head_dim=8, in_channels=8, num_layers=1, norm_num_groups=4, cross_attention_dim=16, norm_type="layer_norm"),
    "PriorTransformer": dict(num_attention_heads=2, attention_head_dim=8, num_layers=2, embedding_dim=16, num_embeddings=4, additional_embeddings=2),
}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(HF_ARCHS))
def test_hf_architecture_from_config_matches_eager_bitwise(name, dtype):
    auto, model_type, kwargs = HF_ARCHS[name]
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    model = check_module_parity(
        lambda: getattr(transformers, auto).from_config(config, dtype=DTYPES[dtype]))
    assert next(model.parameters()).dtype in (DTYPES[dtype], torch.float32)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(DIFFUSERS_MODELS))
def test_diffusers_model_from_config_matches_eager_bitwise(name, dtype):
    model_class = getattr(diffusers, name)
    config = DIFFUSERS_MODELS[name]
    check_module_parity(lambda: model_class.from_config(config).to(DTYPES[dtype]))


if os.environ.get("TORCHDEFER_SWEEP_ALL"):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    _GENERIC = dict(T, num_layers=2, n_layer=2, d_model=32, n_embd=32, n_head=4, num_heads=4,
                    encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64)

    def _small_config_or_none(model_type: str):
        """The shrunk config, if the model builds on meta and stays small (composite
        models keep their sub-configs' default sizes)."""
        try:
            config = transformers.AutoConfig.for_model(model_type, **_GENERIC)
            with torch.device("meta"):
                model = transformers.AutoModel.from_config(config)
        except Exception:
            return None
        return config if sum(p.numel() for p in model.parameters()) <= 3_000_000 else None

    @pytest.mark.parametrize("model_type", sorted(CONFIG_MAPPING_NAMES))
    def test_every_transformers_model_type_that_builds_matches_eager_bitwise(model_type):
        config = _small_config_or_none(model_type)
        if config is None:
            return  # does not build small from the generic config: nothing to compare
        try:
            torch.manual_seed(0)
            transformers.AutoModel.from_config(config)
        except Exception:
            return  # eager construction fails: nothing to compare
        check_module_parity(lambda: transformers.AutoModel.from_config(config))
