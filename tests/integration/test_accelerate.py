"""accelerate's big-model helpers on a deferred model, against its own meta-device path."""

from __future__ import annotations

import pytest
import torch

import torchdefer
from parity import assert_same_module

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")


def _llama(tie: bool = True):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, tie_word_embeddings=tie))


def test_infer_auto_device_map_sees_a_deferred_model_as_an_empty_one():
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_llama)
    with accelerate.init_empty_weights():
        empty = _llama()
    empty.tie_weights()  # a deferred model is tied already
    budget = {0: "40KB", "cpu": "100KB", "disk": "10GB"}
    plan = accelerate.infer_auto_device_map(model, max_memory=budget)
    assert plan == accelerate.infer_auto_device_map(empty, max_memory=budget)
    assert len(set(plan.values())) > 1  # it really split the model
    assert accelerate.utils.compute_module_sizes(model) == accelerate.utils.compute_module_sizes(empty)


def test_load_checkpoint_and_dispatch_then_materialize_matches_from_pretrained(tmp_path):
    torch.manual_seed(1)
    _llama(tie=False).save_pretrained(tmp_path)
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_llama, tie=False)
    model = accelerate.load_checkpoint_and_dispatch(model, str(tmp_path), device_map={"": "cpu"})
    # accelerate loads what the checkpoint has; the rest (rotary inv_freq) is still deferred
    assert torchdefer.is_deferred(model)
    torchdefer.materialize_module(model)
    assert_same_module(model, reference)
    x = torch.randint(0, 100, (1, 6))
    torch.testing.assert_close(model(x).logits, reference(x).logits)


def test_tied_models_load_with_torchdefer_then_dispatch_model(tmp_path):
    torch.manual_seed(1)
    _llama().save_pretrained(tmp_path)
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_llama)
    torchdefer.load_state_dict(model, tmp_path)
    model = accelerate.dispatch_model(model, device_map={"": "cpu"})
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert_same_module(model, reference)


def _partly_empty(include_buffers: bool):
    with accelerate.init_empty_weights(include_buffers=include_buffers):
        empty = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    return empty, torch.nn.Linear(3, 3)


@pytest.mark.parametrize("include_buffers", [False, True])
def test_init_empty_weights_inside_deferred_init_gives_what_eager_gives(include_buffers):
    # accelerate rebuilds each parameter as type(p)(p.to("meta"), **p.__dict__);
    # torchdefer's own fields in that __dict__ must not reach Parameter.__new__.
    torch.manual_seed(0)
    eager_empty, eager_real = _partly_empty(include_buffers)
    eager_state = torch.get_rng_state()
    torch.manual_seed(0)
    empty, real = torchdefer.deferred_init(_partly_empty, include_buffers)
    assert torch.equal(torch.get_rng_state(), eager_state)
    torchdefer.materialize_module(empty)
    torchdefer.materialize_module(real)
    assert_same_module(real, eager_real)
    got = dict(empty.named_parameters()) | dict(empty.named_buffers())
    want = dict(eager_empty.named_parameters()) | dict(eager_empty.named_buffers())
    assert got.keys() == want.keys()
    for name, ref in want.items():
        t = got[name]
        assert (type(t), t.device, t.shape, t.dtype) == (type(ref), ref.device, ref.shape, ref.dtype), name
        if not ref.is_meta:
            assert torch.equal(t, ref), name
