"""safetensors files and sharded directories: the index honoured, damage named, no hang.

Compared with ``safetensors.torch.load_file`` and accelerate's
``load_checkpoint_in_model`` on the same crafted files.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from _crafted import deferred, eager, raw_safetensors, sharded_safetensors, trained_state

import torchdefer
from parity import assert_same_module
from torchdefer.checkpoint import (
    CheckpointError,
    CheckpointFormatError,
    CheckpointKeyError,
    CheckpointNotFoundError,
    UnsafeCheckpointError,
)

safetensors_torch = pytest.importorskip("safetensors.torch")

SHARDS = [["0.weight", "0.bias"], ["1.weight", "1.bias", "1.running_mean", "1.running_var",
                                   "1.num_batches_tracked"], ["2.weight", "2.bias"]]


def _expected(state):
    model = eager()
    model.load_state_dict(state)
    return model


def test_a_sharded_directory_loads_as_accelerate_loads_it(tmp_path):
    from accelerate.utils import load_checkpoint_in_model

    state = trained_state()
    directory = sharded_safetensors(tmp_path / "ckpt", state, SHARDS)
    reference = eager()
    load_checkpoint_in_model(reference, str(directory), strict=True)
    model = deferred()
    torchdefer.load_state_dict(model, directory, strict=True)
    assert_same_module(model, reference)
    assert_same_module(model, _expected(state))


def test_an_index_naming_a_missing_shard_is_an_error_naming_it(tmp_path):
    directory = sharded_safetensors(tmp_path / "ckpt", trained_state(), SHARDS)
    os.remove(directory / "model-00003-of-00003.safetensors")
    model = deferred()
    with pytest.raises(CheckpointNotFoundError, match="model-00003-of-00003.safetensors") as info:
        torchdefer.load_state_dict(model, directory)
    assert isinstance(info.value, FileNotFoundError)
    assert "model.safetensors.index.json" in str(info.value)
    assert torchdefer.is_deferred(model[0].weight)


def test_an_index_entry_outside_the_directory_is_refused(tmp_path):
    state = trained_state()
    directory = sharded_safetensors(tmp_path / "ckpt", state, SHARDS)
    os.rename(directory / "model-00003-of-00003.safetensors", tmp_path / "outside.safetensors")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    index["weight_map"].update({"2.weight": "../outside.safetensors",
                                "2.bias": "../outside.safetensors"})
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UnsafeCheckpointError, match="outside"):
        torchdefer.load_state_dict(deferred(), directory)
    index["weight_map"].update({"2.weight": str(tmp_path / "outside.safetensors")})
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UnsafeCheckpointError, match="outside"):
        torchdefer.load_state_dict(deferred(), directory)


def test_the_same_key_in_two_files_is_an_error_naming_both(tmp_path):
    state = trained_state()
    directory = tmp_path / "ckpt"
    directory.mkdir()
    safetensors_torch.save_file(state, directory / "a.safetensors")
    safetensors_torch.save_file({"0.weight": torch.zeros(8, 6)}, directory / "b.safetensors")
    # Each file alone is fine for safetensors; together the later one would win silently.
    assert torch.equal(safetensors_torch.load_file(directory / "b.safetensors")["0.weight"],
                       torch.zeros(8, 6))
    with pytest.raises(CheckpointFormatError, match=r"'0.weight' is in both .*a.safetensors "
                                                    r"and .*b.safetensors"):
        torchdefer.load_state_dict(deferred(), directory)


def test_a_shard_key_the_index_does_not_list_is_an_error(tmp_path):
    directory = sharded_safetensors(tmp_path / "ckpt", trained_state(), SHARDS)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    del index["weight_map"]["2.bias"]
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointFormatError, match="'2.bias'.*does not list"):
        torchdefer.load_state_dict(deferred(), directory)


def test_an_index_key_its_shard_lacks_is_an_error(tmp_path):
    directory = sharded_safetensors(tmp_path / "ckpt", trained_state(), SHARDS)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    index["weight_map"]["extra"] = "model-00001-of-00003.safetensors"
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointFormatError, match="puts 'extra' in model-00001"):
        torchdefer.load_state_dict(deferred(), directory)


@pytest.mark.parametrize("text", ["{not json", '{"weight_map": []}', '{"metadata": {}}'])
def test_a_damaged_index_names_the_index(tmp_path, text):
    directory = sharded_safetensors(tmp_path / "ckpt", trained_state(), SHARDS)
    (directory / "model.safetensors.index.json").write_text(text)
    with pytest.raises(CheckpointFormatError, match="model.safetensors.index.json"):
        torchdefer.load_state_dict(deferred(), directory)


def test_a_checkpoint_matching_no_key_is_an_error_not_a_warning(tmp_path):
    state = {f"model.{k}": v for k, v in trained_state().items()}
    safetensors_torch.save_file(state, tmp_path / "model.safetensors")
    model = deferred()
    with pytest.raises(CheckpointKeyError, match="prefix 'model.'") as info:
        torchdefer.load_state_dict(model, tmp_path / "model.safetensors")
    assert isinstance(info.value, KeyError)
    assert torchdefer.is_deferred(model)


def test_a_truncated_file_names_the_file(tmp_path):
    safetensors_torch.save_file(trained_state(), tmp_path / "model.safetensors")
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-16])
    with pytest.raises(Exception) as bare:
        safetensors_torch.load_file(tmp_path / "model.safetensors")
    assert not isinstance(bare.value, torchdefer.TorchdeferError)
    with pytest.raises(CheckpointFormatError, match="model.safetensors"):
        torchdefer.load_state_dict(deferred(), tmp_path / "model.safetensors")


def test_a_dtype_torch_cannot_hold_is_refused_before_anything_is_loaded(tmp_path):
    state = trained_state()
    entries = {k: (_st_dtype(v), list(v.shape), v.numpy().tobytes()) for k, v in state.items()
               if k != "2.bias"}
    entries["2.bias"] = ("F6_E2M3", [4], b"\0" * 3)
    raw_safetensors(tmp_path / "model.safetensors", entries)
    model = deferred()
    with pytest.raises(CheckpointFormatError, match="'2.bias' in .*model.safetensors has dtype "
                                                    "F6_E2M3"):
        torchdefer.load_state_dict(model, tmp_path / "model.safetensors")
    assert all(torchdefer.is_deferred(t) for t in model.state_dict().values())


def _st_dtype(t: torch.Tensor) -> str:
    return {torch.float32: "F32", torch.int64: "I64"}[t.dtype]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("as_directory", [False, True], ids=["file", "directory"])
def test_a_fifo_named_model_safetensors_is_refused_without_hanging(tmp_path, as_directory):
    os.mkfifo(tmp_path / "model.safetensors")
    source = tmp_path if as_directory else tmp_path / "model.safetensors"

    def hung(*_):
        raise TimeoutError("load_state_dict blocked on the FIFO")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        with pytest.raises(CheckpointFormatError, match="not a regular file"):
            torchdefer.load_state_dict(deferred(), source)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_two_indexes_in_one_directory_are_an_error(tmp_path):
    directory = sharded_safetensors(tmp_path / "ckpt", trained_state(), SHARDS)
    (directory / "other.safetensors.index.json").write_text('{"weight_map": {}}')
    with pytest.raises(CheckpointFormatError, match="2 safetensors indexes"):
        torchdefer.load_state_dict(deferred(), directory)


@pytest.mark.parametrize("bad", [False, True], ids=["good", "refused"])
def test_the_thread_mapping_file_pages_is_done_when_load_state_dict_returns(tmp_path, bad):
    import threading

    state = trained_state()
    if bad:
        state["2.bias"] = torch.zeros(4)  # a shape mismatch, refused before anything changes
    safetensors_torch.save_file(state, tmp_path / "model.safetensors")
    model = deferred()
    try:
        torchdefer.load_state_dict(model, tmp_path / "model.safetensors")
    except CheckpointError:
        assert bad
    else:
        assert not bad
        assert_same_module(model, _expected(state))
    assert not [t for t in threading.enumerate() if t.name == "torchdefer-map-pages"]
