"""Checkpoints into FSDP2-sharded deferred models on gloo ranks (see test_sharded_checkpoint.py).

Each scenario is ``(rank, world_size) -> None`` and raises on any mismatch with
the eager model loaded by ``Module.load_state_dict``. The checkpoint directory
is shared by the ranks through an environment variable set before spawning.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard

import torchdefer

ALL = [
    "dcp_checkpoint_into_fsdp2_model_matches_eager",
    "safetensors_into_fsdp2_model_matches_eager",
    "a_failed_load_into_fsdp2_model_changes_nothing",
    "tied_names_in_a_dcp_checkpoint_are_all_read_and_compared",
    "a_loaded_buffer_never_shares_a_real_module_tensors_storage",
]


def _llama(tie: bool):
    import transformers

    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, tie_word_embeddings=tie))


def _shard(model) -> None:
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)


def _expected(tie: bool, drop: str | None):
    """The eager model: built from seed 0, then loaded with the seed-1 weights less ``drop``."""
    torch.manual_seed(1)
    state = {k: v for k, v in _llama(tie).state_dict().items() if k != drop}
    torch.manual_seed(0)
    eager = _llama(tie)
    eager.load_state_dict(state, strict=False)
    return eager, state


def _check(model, eager, missing) -> None:
    assert not torchdefer.is_deferred(model)
    gathered = {n: p.full_tensor() for n, p in model.named_parameters()}  # collectives first
    for name, ref in eager.named_parameters():
        assert torch.equal(gathered[name], ref), f"{name} differs from eager"
    for name, ref in eager.named_buffers():
        assert torch.equal(model.get_buffer(name), ref), f"buffer {name} differs"
    x = torch.randint(0, 100, (1, 5))
    torch.testing.assert_close(model(x).logits, eager(x).logits)


def dcp_checkpoint_into_fsdp2_model_matches_eager(rank: int, world: int) -> None:
    # Saved from a model sharded the same way, without lm_head: a new head.
    path = Path(os.environ["TORCHDEFER_TEST_CHECKPOINTS"], f"dcp-{world}")
    eager, state = _expected(tie=False, drop="lm_head.weight")
    torch.manual_seed(1)
    saved = _llama(False)
    _shard(saved)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({k: v for k, v in saved.state_dict().items() if k != "lm_head.weight"},
                 checkpoint_id=path)
    dist.barrier()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_llama, False)
    _shard(model)
    result = torchdefer.load_state_dict(model, path)
    assert result.missing_keys == ("lm_head.weight",), result.missing_keys
    _check(model, eager, result.missing_keys)


def safetensors_into_fsdp2_model_matches_eager(rank: int, world: int) -> None:
    path = Path(os.environ["TORCHDEFER_TEST_CHECKPOINTS"], f"hf-{world}")
    eager, _ = _expected(tie=True, drop=None)
    if rank == 0:
        torch.manual_seed(1)
        _llama(True).save_pretrained(path)
    dist.barrier()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_llama, True)
    _shard(model)
    result = torchdefer.load_state_dict(model, path)
    assert result.missing_keys == (), result.missing_keys
    assert model.lm_head.weight is model.model.embed_tokens.weight
    _check(model, eager, result.missing_keys)


def _all_deferred(model) -> bool:
    return all(torchdefer.is_deferred(p.to_local()) for p in model.parameters())


def a_failed_load_into_fsdp2_model_changes_nothing(rank: int, world: int) -> None:
    """Tied names with different values, a read failing after other shards were prepared,
    and a DCP tensor its chunks cover only in part: each rank refuses, every shard stays
    deferred, and a good load afterwards matches eager."""
    eager, state = _expected(tie=True, drop=None)
    bad = dict(state, **{"lm_head.weight": state["model.embed_tokens.weight"] + 1})
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_llama, True)
    _shard(model)
    try:
        torchdefer.load_state_dict(model, bad)
    except torchdefer.checkpoint.CheckpointMismatchError as e:
        assert "tied" in str(e), e
    else:
        raise AssertionError("different tied values were loaded")
    assert _all_deferred(model), "a failed load changed shards"

    class FailsLate(dict):  # a disk error on a late tensor, after other shards were prepared
        def __getitem__(self, key):
            if key == "model.norm.weight":
                raise OSError("Input/output error")
            return super().__getitem__(key)

    try:
        torchdefer.load_state_dict(model, FailsLate(state))
    except OSError as e:
        assert "Input/output" in str(e), e
    else:
        raise AssertionError("the failing read was not seen")
    assert _all_deferred(model), "a load failing partway changed shards"

    path = Path(os.environ["TORCHDEFER_TEST_CHECKPOINTS"], f"dcp-partial-{world}")
    if rank == 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(state, checkpoint_id=path, no_dist=True)
        metadata_path = path / ".metadata"
        import pickle

        metadata = pickle.loads(metadata_path.read_bytes())  # written just above
        chunk = metadata.state_dict_metadata["model.norm.weight"].chunks[0]
        chunk.sizes = torch.Size([chunk.sizes[0] // 2])
        metadata_path.write_bytes(pickle.dumps(metadata))
    dist.barrier()
    try:
        torchdefer.load_state_dict(model, path)
    except torchdefer.checkpoint.CheckpointFormatError as e:
        assert "model.norm.weight" in str(e) and "uninitialized" in str(e), e
    else:
        raise AssertionError("a partly covered tensor was loaded")
    assert _all_deferred(model), "a failed DCP load changed shards"

    result = torchdefer.load_state_dict(model, state)
    assert result.missing_keys == (), result.missing_keys
    _check(model, eager, result.missing_keys)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


def tied_names_in_a_dcp_checkpoint_are_all_read_and_compared(rank: int, world: int) -> None:
    """Both names of the tied embedding are read into shards and compared on every
    rank: equal values holding a NaN load (bit for bit); values differing in one
    element of the last row (one rank's shard only) are refused on every rank,
    naming both keys and the checkpoint, and every shard stays deferred."""
    _, state = _expected(tie=True, drop=None)
    embed = state["model.embed_tokens.weight"].clone()
    embed[0, 0] = float("nan")
    changed = embed.clone()
    changed[-1, -1] += 1  # the last row: held by the last rank alone
    root = Path(os.environ["TORCHDEFER_TEST_CHECKPOINTS"])
    good, bad = root / f"dcp-tied-{world}", root / f"dcp-tied-bad-{world}"
    if rank == 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for path, head in ((good, embed.clone()), (bad, changed)):
                tied = dict(state, **{"model.embed_tokens.weight": embed.clone(),
                                      "lm_head.weight": head})
                dcp.save(tied, checkpoint_id=path, no_dist=True)
    dist.barrier()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_llama, True)
    _shard(model)
    try:
        torchdefer.load_state_dict(model, bad)
    except torchdefer.checkpoint.CheckpointMismatchError as e:
        text = str(e)
        assert "lm_head.weight" in text and "model.embed_tokens.weight" in text, text
        assert str(bad) in text and "tied" in text, text
    else:
        raise AssertionError(f"rank {rank}: tied names with different values were loaded")
    assert _all_deferred(model), "a refused tie changed shards"
    result = torchdefer.load_state_dict(model, good)
    assert result.missing_keys == (), result.missing_keys
    assert model.lm_head.weight is model.model.embed_tokens.weight
    full = model.model.embed_tokens.weight.full_tensor()
    assert torch.equal(_bits(full), _bits(embed)), "the tied embedding is not the stored one"


class _TwoBuffers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("a", torch.zeros(3))
        self.register_buffer("b", torch.zeros(3))


def a_loaded_buffer_never_shares_a_real_module_tensors_storage(rank: int, world: int) -> None:
    """A deferred buffer loaded from the very tensor a real buffer of the module holds
    gets a copy, as in the unsharded loader and in eager (which copies into its own)."""
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_TwoBuffers)
    fully_shard(model)
    model.a = torch.ones(3)  # real, as a buffer set by hand is
    torch.manual_seed(1)
    state = {n: p.detach() for n, p in _TwoBuffers().named_parameters()}
    state |= {"a": model.a, "b": model.a}  # one tensor under both names
    torchdefer.load_state_dict(model, state)
    assert model.b.untyped_storage().data_ptr() != model.a.untyped_storage().data_ptr()
    model.b.add_(1)
    assert torch.equal(model.a, torch.ones(3)), "writing b changed a: they share memory"
