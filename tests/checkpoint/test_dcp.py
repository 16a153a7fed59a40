"""DCP directories: no pickle from the file runs, every tensor fully covered, files inside.

Compared with ``dcp.load`` (and DCP's own ``FileSystemReader``) on the same
crafted directories: where they run code or leave uninitialized memory,
torchdefer refuses with an error naming the file and key.
"""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from _crafted import RunsCode, dcp_save, deferred, eager, edit_dcp_metadata, trained_state

import torchdefer
from parity import assert_same_module
from torchdefer.checkpoint import (
    CheckpointFormatError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    UnsafeCheckpointError,
)

dcp = pytest.importorskip("torch.distributed.checkpoint")
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata  # noqa: E402


def _dcp_load(state, directory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=directory)


def test_a_metadata_pickle_that_runs_code_is_refused_before_it_runs(tmp_path):
    directory = dcp_save(tmp_path / "ckpt", trained_state())
    marker = tmp_path / "ran"
    edit_dcp_metadata(directory, lambda md: setattr(md, "planner_data", RunsCode(marker)))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata asks to load posix.mkdir") as e:
        torchdefer.load_state_dict(deferred(), directory)
    assert isinstance(e.value, pickle.UnpicklingError)
    assert not marker.exists()
    dcp.FileSystemReader(str(directory)).read_metadata()  # DCP itself runs it
    assert marker.exists()


def test_a_non_tensor_entry_that_runs_code_is_never_unpickled(tmp_path):
    marker = tmp_path / "ran"
    state = dict(trained_state(), **{"0.bias": RunsCode(marker)})
    directory = dcp_save(tmp_path / "ckpt", state)
    model = deferred()
    with pytest.raises(CheckpointMismatchError, match="'0.bias' in .*is a pickled"):
        torchdefer.load_state_dict(model, directory)
    assert not marker.exists()
    assert torchdefer.is_deferred(model[0].bias)
    _dcp_load({"0.bias": torch.empty(8)}, directory)  # dcp.load unpickles it, and runs it
    assert marker.exists()


def test_a_non_tensor_entry_under_another_key_is_ignored_unread(tmp_path):
    marker = tmp_path / "ran"
    directory = dcp_save(tmp_path / "ckpt", dict(trained_state(), step=RunsCode(marker)))
    with pytest.warns(UserWarning, match="'step'"):
        torchdefer.load_state_dict(deferred(), directory)
    assert not marker.exists()


def test_metadata_covering_part_of_a_tensor_is_refused_where_dcp_leaves_garbage(tmp_path):
    state = trained_state()
    directory = dcp_save(tmp_path / "ckpt", state)

    def half(md):
        md.state_dict_metadata["0.weight"].chunks[0] = ChunkStorageMetadata(
            offsets=torch.Size([0, 0]), sizes=torch.Size([4, 6]))

    edit_dcp_metadata(directory, half)
    target = {"0.weight": torch.full((8, 6), float("nan"))}
    _dcp_load(target, directory)  # no error: half the rows keep what the memory held
    assert target["0.weight"][4:].isnan().all() and not target["0.weight"][:4].isnan().any()
    model = deferred()
    with pytest.raises(CheckpointFormatError, match="'0.weight'.*covering 24 of its 48"):
        torchdefer.load_state_dict(model, directory)
    assert torchdefer.is_deferred(model[0].weight)


def test_a_data_file_outside_the_directory_is_refused(tmp_path):
    directory = dcp_save(tmp_path / "ckpt", trained_state())

    def escape(md):
        for info in md.storage_data.values():
            info.relative_path = "../elsewhere/__0_0.distcp"

    edit_dcp_metadata(directory, escape)
    (tmp_path / "elsewhere").mkdir()
    (directory / "__0_0.distcp").rename(tmp_path / "elsewhere" / "__0_0.distcp")
    with pytest.raises(UnsafeCheckpointError, match="outside the checkpoint directory"):
        torchdefer.load_state_dict(deferred(), directory)


def test_a_missing_data_file_names_it(tmp_path):
    directory = dcp_save(tmp_path / "ckpt", trained_state())
    (directory / "__0_0.distcp").unlink()
    with pytest.raises(CheckpointNotFoundError, match="__0_0.distcp"):
        torchdefer.load_state_dict(deferred(), directory)


def test_damaged_tensor_data_is_a_checkpoint_error_not_a_checkpoint_exception(tmp_path):
    directory = dcp_save(tmp_path / "ckpt", trained_state())
    data = bytearray((directory / "__0_0.distcp").read_bytes())
    data[:] = b"\0" * len(data)
    (directory / "__0_0.distcp").write_bytes(bytes(data))
    with pytest.raises(BaseException) as raw:
        _dcp_load({"0.weight": torch.empty(8, 6)}, directory)
    assert not isinstance(raw.value, Exception)  # DCP's CheckpointException escapes `except Exception`
    model = deferred()
    with pytest.raises(CheckpointFormatError, match="ckpt") as info:
        torchdefer.load_state_dict(model, directory)
    assert "Traceback" not in str(info.value)
    assert all(torchdefer.is_deferred(t) for t in model.state_dict().values())


def test_a_metadata_file_that_is_not_dcp_metadata_names_it(tmp_path):
    directory = dcp_save(tmp_path / "ckpt", trained_state())
    (directory / ".metadata").write_bytes(pickle.dumps({"not": "metadata"}))
    with pytest.raises(CheckpointFormatError, match=r"\.metadata does not hold DCP Metadata"):
        torchdefer.load_state_dict(deferred(), directory)
    (directory / ".metadata").write_bytes(b"garbage")
    with pytest.raises(CheckpointFormatError, match=r"\.metadata is not readable"):
        torchdefer.load_state_dict(deferred(), directory)


def test_a_dcp_checkpoint_into_a_materialized_model_matches_dcp_load(tmp_path):
    state = trained_state()
    directory = dcp_save(tmp_path / "ckpt", state)
    model = torchdefer.materialize_module(deferred())
    torchdefer.load_state_dict(model, directory, strict=True)
    reference = eager()
    target = reference.state_dict()
    _dcp_load(target, directory)
    reference.load_state_dict(target)
    assert_same_module(model, reference)


def test_overlapping_chunks_are_refused(tmp_path):
    directory = dcp_save(tmp_path / "ckpt", trained_state())

    def overlap(md):
        md.state_dict_metadata["0.weight"].chunks.append(ChunkStorageMetadata(
            offsets=torch.Size([4, 0]), sizes=torch.Size([4, 6])))

    edit_dcp_metadata(directory, overlap)
    with pytest.raises(CheckpointFormatError, match="'0.weight'.*overlapping chunks"):
        torchdefer.load_state_dict(deferred(), directory)


def _chunks(*boxes):
    return [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s)) for o, s in boxes]


@pytest.mark.parametrize(("boxes", "problem"), [
    ((((0, 0), (2, 4)), ((2, 0), (2, 4))), None),  # rows split (FSDP)
    ((((0, 0), (4, 2)), ((0, 2), (4, 2))), None),  # columns split (tensor parallel)
    ((((0, 0), (2, 2)), ((0, 2), (2, 2)), ((2, 0), (2, 2)), ((2, 2), (2, 2))), None),  # 2-D
    ((((0, 0), (2, 2)), ((0, 2), (2, 2)), ((2, 0), (2, 2))), "covering 12 of its 16"),
    ((((0, 0), (3, 3)), ((2, 2), (2, 2)), ((0, 3), (1, 1))), "overlapping"),
    ((((0, 0), (4, 5)),), "outside its shape"),
])
def test_chunk_coverage_is_exact(boxes, problem):
    from torchdefer.checkpoint._dcp import _coverage_problem

    found = _coverage_problem((4, 4), _chunks(*boxes))
    if problem is None:
        assert found is None
    else:
        assert problem in found[0]


def test_bad_arguments_are_usage_errors():
    with pytest.raises(TypeError) as e:
        torchdefer.load_state_dict(deferred(), trained_state(), dtype=torch.int8)
    assert isinstance(e.value, torchdefer.checkpoint.CheckpointUsageError)
    with pytest.raises(torchdefer.checkpoint.CheckpointUsageError):
        torchdefer.load_state_dict(deferred(), trained_state(), device="gpu")
