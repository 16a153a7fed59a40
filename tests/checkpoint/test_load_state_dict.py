"""torchdefer.load_state_dict against eager construction + Module.load_state_dict."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _llama(tie: bool = True, vocab: int = 100):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab, tie_word_embeddings=tie))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))


def _eager_loaded(build, state_dict, seed=0, strict=False):
    """What users get today: eager construction, then Module.load_state_dict."""
    torch.manual_seed(seed)
    model = build()
    model.load_state_dict(state_dict, strict=strict)
    return model


def _deferred(build, seed=0):
    torch.manual_seed(seed)
    return torchdefer.deferred_init(build)


def _trained_state(build, seed=1):
    torch.manual_seed(seed)
    return build().state_dict()


def test_loading_a_partial_state_dict_matches_eager_load_state_dict():
    state = {k: v for k, v in _trained_state(_mlp).items() if not k.startswith("2.")}
    model = _deferred(_mlp)
    result = torchdefer.load_state_dict(model, state)
    assert result.missing_keys == ("2.weight", "2.bias")
    assert result.unexpected_keys == ()
    assert_same_module(model, _eager_loaded(_mlp, state))


def test_loaded_tensors_are_assigned_without_a_copy_when_dtype_and_device_match():
    state = _trained_state(_mlp)
    model = _deferred(_mlp)
    torchdefer.load_state_dict(model, state)
    assert model[0].weight.data_ptr() == state["0.weight"].data_ptr()
    assert isinstance(model[0].weight, nn.Parameter) and model[0].weight.requires_grad


def test_loaded_tensors_are_not_replayed():
    # The weight is recorded from an external tensor changed afterwards:
    # replaying it would raise ExternalTensorModifiedError.
    outside = torch.ones(3, 3)

    def build():
        m = nn.Linear(3, 3)
        with torch.no_grad():
            m.weight.copy_(outside)
        return m

    model = _deferred(build)
    outside.add_(1)
    with pytest.raises(torchdefer.materialize.ExternalTensorModifiedError):
        torchdefer.materialize_tensor(model.weight)
    state = {"weight": torch.full((3, 3), 7.0), "bias": torch.zeros(3)}
    torchdefer.load_state_dict(model, state)
    assert torch.equal(model.weight, state["weight"])


def test_a_tied_checkpoint_keeps_lm_head_tied(tmp_path):
    torch.manual_seed(1)
    trained = _llama(tie=True)
    trained.save_pretrained(tmp_path)  # safetensors holds the tied weight once
    model = _deferred(_llama)
    result = torchdefer.load_state_dict(model, tmp_path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert result.missing_keys == ()
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    assert_same_module(model, reference)


def test_torch_assign_load_unties_where_torchdefer_does_not():
    torch.manual_seed(1)
    state = {k: v for k, v in _llama(tie=True).state_dict().items() if k != "lm_head.weight"}
    torch.manual_seed(0)
    with torch.device("meta"):
        meta = _llama(tie=True)
    meta.load_state_dict(state, assign=True, strict=False)
    assert meta.lm_head.weight is not meta.model.embed_tokens.weight  # the trap
    model = _deferred(_llama)
    torchdefer.load_state_dict(model, state)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_new_head_is_materialized_as_eager_construction_made_it(tmp_path):
    torch.manual_seed(1)
    _llama(tie=False).save_pretrained(tmp_path)
    bigger = lambda: _llama(tie=False)  # noqa: E731
    state = {k: v for k, v in safetensors_torch.load_file(tmp_path / "model.safetensors").items()
             if k != "lm_head.weight"}
    model = _deferred(bigger)
    result = torchdefer.load_state_dict(model, state)
    assert result.missing_keys == ("lm_head.weight",)
    assert_same_module(model, _eager_loaded(bigger, state))


def test_sharded_safetensors_directory_loads_like_from_pretrained(tmp_path):
    torch.manual_seed(1)
    _llama(tie=False).save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    model = _deferred(lambda: _llama(tie=False))
    torchdefer.load_state_dict(model, tmp_path, strict=True)
    assert_same_module(model, transformers.LlamaForCausalLM.from_pretrained(tmp_path))


def test_a_torch_save_file_loads(tmp_path):
    state = _trained_state(_mlp)
    torch.save(state, tmp_path / "model.pt")
    model = _deferred(_mlp)
    torchdefer.load_state_dict(model, tmp_path / "model.pt", strict=True)
    assert_same_module(model, _eager_loaded(_mlp, state, strict=True))


def test_a_dcp_checkpoint_loads_in_one_process(tmp_path):
    import torch.distributed.checkpoint as dcp

    state = _trained_state(_mlp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=tmp_path)
        model = _deferred(_mlp)
        result = torchdefer.load_state_dict(model, tmp_path)
    assert result.missing_keys == ()
    assert_same_module(model, _eager_loaded(_mlp, state))


def test_dtype_converts_loaded_and_missing_tensors_like_module_to():
    state = {k: v for k, v in _trained_state(_mlp).items() if not k.startswith("2.")}
    model = _deferred(_mlp)
    torchdefer.load_state_dict(model, state, dtype=torch.bfloat16)
    assert_same_module(model, _eager_loaded(_mlp, state).to(torch.bfloat16))
    assert model[1].num_batches_tracked.dtype == torch.int64


def test_materialize_missing_false_leaves_the_missing_tensors_deferred():
    state = {k: v for k, v in _trained_state(_mlp).items() if not k.startswith("2.")}
    model = _deferred(_mlp)
    torchdefer.load_state_dict(model, state, materialize_missing=False)
    assert torchdefer.is_deferred(model[2].weight)
    assert not torchdefer.is_deferred(model[0].weight)
    torchdefer.materialize_module(model)
    assert_same_module(model, _eager_loaded(_mlp, state))


def test_strict_refuses_missing_and_unexpected_keys_before_loading_anything():
    state = {"0.weight": torch.zeros(8, 6), "extra": torch.zeros(1)}
    model = _deferred(_mlp)
    with pytest.raises(KeyError, match="missing keys '0.bias'.*unexpected keys 'extra'") as e:
        torchdefer.load_state_dict(model, state, strict=True)
    assert isinstance(e.value, torchdefer.checkpoint.CheckpointKeyError)
    assert torchdefer.is_deferred(model[0].weight)


def test_unexpected_keys_are_reported_with_a_warning():
    state = dict(_trained_state(_mlp), extra=torch.zeros(1))
    model = _deferred(_mlp)
    with pytest.warns(UserWarning, match="'extra'"):
        result = torchdefer.load_state_dict(model, state)
    assert result.unexpected_keys == ("extra",)


def test_a_shape_mismatch_names_the_key_and_both_shapes():
    model = _deferred(_mlp)
    with pytest.raises(ValueError, match=r"'0.weight' has shape \(8, 6\) in the module but "
                                         r"\(6, 8\) in the state dict") as e:
        torchdefer.load_state_dict(model, {"0.weight": torch.zeros(6, 8)})
    assert isinstance(e.value, torchdefer.checkpoint.CheckpointMismatchError)


def test_tied_names_with_different_values_are_refused():
    model = _deferred(_llama)
    state = {"model.embed_tokens.weight": torch.zeros(100, 32),
             "lm_head.weight": torch.ones(100, 32)}
    with pytest.raises(ValueError, match="same \\(tied\\) tensor") as e:
        torchdefer.load_state_dict(model, state)
    assert isinstance(e.value, torchdefer.TorchdeferError)


def test_a_device_this_host_lacks_asks_for_device():
    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU, or cuda:0 on CPU
    model = torchdefer.deferred_init(nn.Linear, 2, 2, device=missing)
    state = {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}
    with pytest.raises(RuntimeError, match="device=") as e:
        torchdefer.load_state_dict(model, state)
    assert isinstance(e.value, torchdefer.checkpoint.CheckpointDeviceError)
    torchdefer.load_state_dict(model, state, device="cpu")
    assert torch.equal(model.weight, state["weight"])


def test_a_directory_without_a_checkpoint_says_what_it_expects(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither \\*.safetensors") as e:
        torchdefer.load_state_dict(_deferred(_mlp), tmp_path)
    assert isinstance(e.value, torchdefer.TorchdeferError)


def test_deferred_init_of_from_pretrained_matches_from_pretrained(tmp_path):
    torch.manual_seed(1)
    _llama(tie=True).save_pretrained(tmp_path)
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    model = torchdefer.deferred_init(transformers.LlamaForCausalLM.from_pretrained, tmp_path)
    assert torchdefer.is_deferred(model)
    torchdefer.materialize_module(model)
    assert_same_module(model, reference)


def test_a_new_head_costs_only_its_own_draws(monkeypatch):
    """With exact generator positions, nothing of the loaded model's init is replayed."""
    from torchdefer.materialize._rng_replay import RngReplay

    drawn = []
    run = RngReplay.run

    def counting(self, node, args, kwargs):
        drawn.append(node)
        return run(self, node, args, kwargs)

    monkeypatch.setattr(RngReplay, "run", counting)
    model = _deferred(lambda: _llama(tie=False))
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in state.items()}
    torchdefer.load_state_dict(model, state)
    head = model.lm_head.weight
    assert drawn, "the head's init was not replayed at all"
    # Every replayed draw wrote the head (its constructor init is hidden by
    # _init_weights' normal_, so only that one runs).
    assert all(n.outputs[0].meta.size == tuple(head.shape) for n in drawn)
    assert len(drawn) == 1
