"""torch.save files: weights_only always, mmap only where exact, the legacy format, clear errors.

Each case is compared with ``torch.load(weights_only=True)`` (what a careful
user runs) on the same crafted file: torchdefer is never worse.
"""

from __future__ import annotations

import pickle
import zipfile

import pytest
import torch
from _crafted import RunsCode, deferred, eager, mlp, rezip, trained_state

import torchdefer
from parity import assert_same_module
from torchdefer.checkpoint import (
    CheckpointFormatError,
    CheckpointMismatchError,
    UnsafeCheckpointError,
)


def _expected(state):
    model = eager()
    model.load_state_dict(state)
    return model


def test_a_compressed_archive_loads_the_right_values_where_mmap_reads_garbage(tmp_path):
    state = trained_state()
    torch.save(state, tmp_path / "plain.pt")
    packed = rezip(tmp_path / "plain.pt", tmp_path / "packed.pt", zipfile.ZIP_DEFLATED)
    mapped = torch.load(packed, mmap=True, weights_only=True)
    assert not torch.equal(mapped["0.weight"], state["0.weight"])  # torch's mmap: garbage
    model = deferred()
    torchdefer.load_state_dict(model, packed, strict=True)
    assert_same_module(model, _expected(state))


def test_a_record_shorter_than_declared_is_refused_on_every_torch(tmp_path):
    state = trained_state()
    torch.save(state, tmp_path / "plain.pt")
    short = rezip(tmp_path / "plain.pt", tmp_path / "short.pt", shorten="data/0")
    try:  # torch 2.8 reads it, the missing bytes from uninitialized memory; later ones refuse
        torch.load(short, weights_only=True)
    except RuntimeError as e:
        assert "record size" in str(e)
    torch.load(short, mmap=True, weights_only=True)  # mmap reads past the record, silently
    model = deferred()
    with pytest.raises(CheckpointFormatError, match="short.pt") as info:
        torchdefer.load_state_dict(model, short)
    assert isinstance(info.value, ValueError)
    assert "data/0 holds" in str(info.value) and "truncated" in str(info.value)
    assert torchdefer.is_deferred(model)


def test_a_pickle_that_runs_code_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"0.weight": torch.zeros(8, 6), "x": RunsCode(marker)}, tmp_path / "evil.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "evil.pt", weights_only=True)
    with pytest.raises(UnsafeCheckpointError, match="evil.pt") as info:
        torchdefer.load_state_dict(deferred(), tmp_path / "evil.pt")
    assert isinstance(info.value, pickle.UnpicklingError)
    assert not marker.exists()
    torch.load(tmp_path / "evil.pt", weights_only=False)  # what the refusal protects from
    assert marker.exists()


def test_the_legacy_format_is_read_as_torch_load_reads_it(tmp_path):
    state = trained_state()
    torch.save(state, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    reference = torch.load(tmp_path / "old.pt", weights_only=True)
    model = deferred()
    torchdefer.load_state_dict(model, tmp_path / "old.pt", strict=True)
    assert_same_module(model, _expected(reference))


def test_a_legacy_file_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"x": RunsCode(marker)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(UnsafeCheckpointError, match="old.pt"):
        torchdefer.load_state_dict(deferred(), tmp_path / "old.pt")
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", b"PK\x03\x04broken"],
                         ids=["empty", "text", "broken-zip"])
def test_a_file_that_is_not_a_checkpoint_names_the_file(tmp_path, content):
    path = tmp_path / "model.bin"
    path.write_bytes(content)
    with pytest.raises(CheckpointFormatError, match="model.bin") as info:
        torchdefer.load_state_dict(deferred(), path)
    assert "mmap" not in str(info.value)
    assert isinstance(info.value, torchdefer.TorchdeferError)


def test_a_truncated_archive_names_the_file(tmp_path):
    torch.save(trained_state(), tmp_path / "model.pt")
    data = (tmp_path / "model.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointFormatError, match="cut.pt"):
        torchdefer.load_state_dict(deferred(), tmp_path / "cut.pt")


def test_a_file_without_a_state_dict_says_what_it_holds(tmp_path):
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    with pytest.raises(CheckpointFormatError, match="holds a list, not a state dict"):
        torchdefer.load_state_dict(deferred(), tmp_path / "list.pt")


def test_a_non_tensor_under_a_module_key_is_refused(tmp_path):
    state = dict(trained_state(), **{"0.bias": 3})
    torch.save(state, tmp_path / "model.pt")
    model = deferred()
    with pytest.raises(CheckpointMismatchError, match="'0.bias' in .*model.pt holds a int"):
        torchdefer.load_state_dict(model, tmp_path / "model.pt")
    assert torchdefer.is_deferred(model)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_torchscript_archive_is_refused_as_code(tmp_path):
    torch.jit.save(torch.jit.script(mlp().eval()), tmp_path / "scripted.pt")
    with pytest.raises(UnsafeCheckpointError, match="TorchScript"):
        torchdefer.load_state_dict(deferred(), tmp_path / "scripted.pt")


def test_an_uncompressed_exact_archive_is_memory_mapped(tmp_path):
    from torchdefer.checkpoint._torch_save import open_file

    torch.save(trained_state(), tmp_path / "model.pt")
    assert open_file(tmp_path / "model.pt").notes == []
    packed = rezip(tmp_path / "model.pt", tmp_path / "packed.pt", zipfile.ZIP_DEFLATED)
    assert "without mmap" in open_file(packed).notes[0]


def test_saving_over_the_loaded_file_does_not_change_the_model(tmp_path):
    # torch.save truncates and rewrites the file in place: weights still mapped
    # from it would silently take the new file's bytes.
    state = trained_state()
    torch.save(state, tmp_path / "model.pt")
    mapped = torch.load(tmp_path / "model.pt", mmap=True, weights_only=True)
    model = deferred()
    torchdefer.load_state_dict(model, tmp_path / "model.pt", strict=True)
    torch.save({k: torch.zeros_like(v) for k, v in state.items()}, tmp_path / "model.pt")
    assert not torch.equal(mapped["0.weight"], state["0.weight"])  # torch.load(mmap=True)
    assert_same_module(model, _expected(state))


def test_a_state_dict_one_level_down_is_named_in_the_error(tmp_path):
    torch.save({"model": trained_state(), "epoch": 3}, tmp_path / "train.pt")
    with pytest.raises(torchdefer.checkpoint.CheckpointKeyError, match=r"\['model'\]"):
        torchdefer.load_state_dict(deferred(), tmp_path / "train.pt")
