"""Hugging Face Llama and GPT-2 with their default configs (use_cache=True: a
DynamicCache in the output) on the default backend, eager and deferred."""

import pytest
import torch

import torchdefer
from torchdefer.descriptors import DescriptorConflict, DescriptorMismatch, MetaTensorType

transformers = pytest.importorskip("transformers")

VOCAB = 64
IDS = {"input_ids": MetaTensorType(["b", "s"], torch.long)}
SIZES = [(2, 5), (3, 2), (1, 4), (2, 1), (1, 1), (4, 9)]


def llama_config():
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip


def gpt2_config():
    return transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=128,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip


FAMILIES = {
    "llama": (transformers.LlamaForCausalLM, llama_config),
    "gpt2": (transformers.GPT2LMHeadModel, gpt2_config),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    cls, config = FAMILIES[request.param]
    torch.manual_seed(0)
    model = cls(config()).eval()
    assert model.config.use_cache
    return cls, config, model, torchdefer.script(model, IDS)


def test_program_matches_eager_logits_and_cache_for_several_batch_and_sequence_lengths(family):
    _, _, model, p = family
    for b, s in SIZES:
        ids = torch.randint(0, VOCAB, (b, s))
        with torch.no_grad():
            got, want = p(ids), model(ids)
        assert type(got) is type(want)
        assert type(got.past_key_values) is type(want.past_key_values)
        torch.testing.assert_close(got.logits, want.logits)
        for mine, theirs in zip(got.past_key_values.layers, want.past_key_values.layers):
            torch.testing.assert_close((mine.keys, mine.values), (theirs.keys, theirs.values))


def test_output_descriptors_name_the_logits_lengths_after_the_inputs(family):
    _, _, _, p = family
    assert p.output_descriptors.logits.shape == ("b", "s", VOCAB)


def test_program_rejects_float_ids(family):
    _, _, _, p = family
    with pytest.raises(DescriptorMismatch, match="input_ids.dtype: expected torch.int64, got torch.float32"):
        p(torch.zeros(1, 4))


def test_program_with_a_cache_in_its_outputs_says_how_to_save_it(family, tmp_path):
    _, _, _, p = family
    with pytest.raises(TypeError, match=r"outputs hold a transformers.cache_utils.DynamicCache, which torch.utils._pytree does not know.*register_dynamic_cache_export_support"):
        torchdefer.save_program(p, tmp_path / "model.tdp")


def test_deferred_model_scripts_without_weights_and_matches_eager_once_materialized(family):
    cls, config, model, _ = family
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(cls, config()).eval()
    p = torchdefer.script(deferred, IDS)
    assert torchdefer.is_deferred(deferred)
    with pytest.raises(RuntimeError, match="has no data.*materialize_module"):
        p(torch.zeros(1, 3, dtype=torch.long))
    torchdefer.materialize_module(deferred)
    for b, s in SIZES[:3]:
        ids = torch.randint(0, VOCAB, (b, s))
        with torch.no_grad():
            torch.testing.assert_close(p(ids).logits, model(ids).logits)


def test_program_without_cache_round_trips_through_save_and_load(tmp_path):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config()).eval()
    desc = {**IDS, "use_cache": False}
    p = torchdefer.script(model, desc)
    torchdefer.save_program(p, tmp_path / "llama.tdp")
    q = torchdefer.load_program(tmp_path / "llama.tdp")
    assert q.output_descriptors.logits.shape == ("b", "s", VOCAB)
    ids = torch.randint(0, VOCAB, (2, 5))
    with torch.no_grad():
        got, want = q(ids, use_cache=False), model(ids, use_cache=False)
    assert type(got) is type(want)
    torch.testing.assert_close(got.logits, want.logits)


def test_conflict_message_uses_the_descriptor_names():
    model = transformers.GPT2LMHeadModel(gpt2_config()).eval()
    mask = MetaTensorType(["b", "t"], torch.long)
    try:
        program = torchdefer.script(model, {**IDS, "attention_mask": mask})
    except DescriptorConflict as conflict:
        e = conflict
    else:
        # On older torch (2.8) transformers builds the mask without tying its
        # length to the ids' (no conflict to report): then the program must
        # be right for unequal lengths.
        for s, t in [(5, 7), (3, 9), (6, 2)]:
            ids = torch.randint(0, VOCAB, (2, s))
            attention = torch.ones(2, t, dtype=torch.long)
            attention[0, 0] = 0
            expected = model(input_ids=ids, attention_mask=attention).logits
            assert torch.equal(program(input_ids=ids, attention_mask=attention).logits, expected)
        return
    message = str(e)
    assert "'s', 't' are described as symbolic, but the code requires:" in message
    assert "masking_utils.py" in message
    assert e.dims == ("s", "t")
    guards = [line for line in message.splitlines() if line.startswith("    ")]
    assert guards and not any(sym in line for line in guards for sym in ("s7", "s5", "s4"))
