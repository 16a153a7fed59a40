"""save_state_dict of transformers models whose checkpoint layout is not their modules'.

``save_pretrained`` reverts transformers' weight conversions: renames (ViT's
``layers.0.attention.q_proj`` is saved as ``encoder.layer.0.attention.attention.query``,
GraniteMoe's experts as ``input_linear``) and converters that compute saved
tensors from several module tensors (Mixtral's fused experts, split back). The
renames are written as ``save_pretrained`` writes them (byte for byte, and
``from_pretrained`` loads eager's values); converters are refused, naming the
model and the conversion, and DCP still writes such a model under its own names.
"""

from __future__ import annotations

import filecmp
import os

import pytest
import torch

import torchdefer
from torchdefer.checkpoint import CheckpointWriteError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
transformers = pytest.importorskip("transformers")
safe_open = pytest.importorskip("safetensors").safe_open
pytest.importorskip("transformers.core_model_loading")


def _vit():
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=37, image_size=8, patch_size=4)
    return transformers.ViTModel, config


def _granite(tied: bool = True):
    config = transformers.GraniteMoeConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=50, num_local_experts=3, num_experts_per_tok=2,
        tie_word_embeddings=tied)
    return transformers.GraniteMoeForCausalLM, config


def _mixtral():
    config = transformers.MixtralConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=50, num_local_experts=2)
    return transformers.MixtralForCausalLM, config


def _both(cls, config, seed: int = 0):
    torch.manual_seed(seed)
    eager = cls(config)
    torch.manual_seed(seed)
    return eager, torchdefer.deferred_init(cls, config)


def _same_files(a, b) -> None:
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b))
    for name in names:
        assert filecmp.cmp(a / name, b / name, shallow=False), name


@pytest.mark.parametrize("model", [_vit, _granite, lambda: _granite(tied=False)])
@pytest.mark.parametrize("dtype,shard", [(None, "50GB"), (torch.bfloat16, 3_000)])
def test_renamed_weights_are_written_byte_for_byte_as_save_pretrained_writes_them(
        tmp_path, model, dtype, shard):
    cls, config = model()
    eager, lazy = _both(cls, config)
    out = torchdefer.save_state_dict(lazy, tmp_path / "ours", dtype=dtype, max_shard_size=shard)
    if dtype is not None:
        eager.to(dtype)
    eager.save_pretrained(tmp_path / "hf", max_shard_size=shard)
    _same_files(out, tmp_path / "hf")
    assert torchdefer.is_deferred(lazy)


@pytest.mark.parametrize("model", [_vit, _granite])
def test_from_pretrained_loads_renamed_weights_as_eager_construction_then_to_bfloat16(
        tmp_path, model):
    cls, config = model()
    eager, lazy = _both(cls, config)
    out = torchdefer.save_state_dict(lazy, tmp_path / "init", dtype=torch.bfloat16,
                                     max_shard_size=4_000)
    saved = set()
    for f in out.glob("*.safetensors"):
        with safe_open(f, "pt") as handle:
            saved.update(handle.keys())
    assert saved - set(eager.state_dict()), "the model's saved layout renames some tensors"
    loaded = cls.from_pretrained(out)
    expected = eager.to(torch.bfloat16).state_dict()
    got = loaded.state_dict()
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name


def test_weights_save_pretrained_converts_are_refused_naming_the_model_and_conversion(
        tmp_path):
    cls, config = _mixtral()
    _, lazy = _both(cls, config)
    with pytest.raises(CheckpointWriteError) as error:
        torchdefer.save_state_dict(lazy, tmp_path / "m")
    message = str(error.value)
    assert "MixtralForCausalLM" in message
    assert "WeightConverter" in message and "experts" in message
    assert "format='dcp'" in message and "save_pretrained" in message
    assert list(tmp_path.iterdir()) == []


def test_dcp_writes_a_converted_model_under_its_module_names(tmp_path):
    import torch.distributed.checkpoint as dcp

    cls, config = _mixtral()
    eager, lazy = _both(cls, config)
    out = torchdefer.save_state_dict(lazy, tmp_path / "seed", format="dcp")
    torch.manual_seed(4)
    state = cls(config).state_dict()
    dcp.load(state, checkpoint_id=str(out), no_dist=True)
    for name, tensor in eager.state_dict().items():
        assert torch.equal(state[name], tensor), name


def test_a_model_from_pretrained_is_written_with_the_conversions_it_was_loaded_with(tmp_path):
    cls, config = _vit()
    eager, _ = _both(cls, config)
    eager.save_pretrained(tmp_path / "first")
    loaded = cls.from_pretrained(tmp_path / "first")  # keeps its _weight_conversions
    out = torchdefer.save_state_dict(loaded, tmp_path / "ours")
    loaded.save_pretrained(tmp_path / "hf")
    _same_files(out, tmp_path / "hf")
