"""A failed load of every kind leaves every tensor as it was, and a following good load works.

Checked tensor by tensor (object identity, class, deferred or real, and the
bits of real ones), into a deferred model and into one already materialized.
"""

from __future__ import annotations

import zipfile

import pytest
import torch
from _crafted import (
    assert_unchanged,
    dcp_save,
    deferred,
    eager,
    edit_dcp_metadata,
    mlp,
    raw_safetensors,
    rezip,
    sharded_safetensors,
    snapshot,
    trained_state,
)
from torch import nn

import torchdefer
from parity import assert_same_module
from torchdefer.checkpoint import CheckpointError


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)  # first: prepared before the tie is found different
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def _bad_last_shape(tmp_path):
    state = trained_state()
    state["2.bias"] = torch.zeros(4)  # the last key, after every good one
    return mlp, state


def _tied_different(tmp_path):
    state = trained_state(Tied)
    state["head.weight"] = state["head.weight"] + 1
    return Tied, state


def _unreadable_dtype(tmp_path):
    state = trained_state()
    entries = {k: ({torch.float32: "F32", torch.int64: "I64"}[v.dtype], list(v.shape),
                   v.numpy().tobytes()) for k, v in state.items()}
    entries["2.bias"] = ("F6_E2M3", [3], b"\0" * 3)
    return mlp, raw_safetensors(tmp_path / "model.safetensors", entries)


def _non_tensor(tmp_path):
    return mlp, dict(trained_state(), **{"2.bias": "three"})


def _short_record(tmp_path):
    torch.save(trained_state(), tmp_path / "model.pt")
    last = len(trained_state()) - 1
    return mlp, rezip(tmp_path / "model.pt", tmp_path / "short.pt", zipfile.ZIP_STORED,
                      shorten=f"data/{last}")


def _missing_shard(tmp_path):
    state = trained_state()
    keys = list(state)
    directory = sharded_safetensors(tmp_path / "ckpt", state, [keys[:5], keys[5:]])
    (directory / "model-00002-of-00002.safetensors").unlink()
    return mlp, directory


def _dcp_partial(tmp_path):
    directory = dcp_save(tmp_path / "ckpt", trained_state())

    def drop(md):
        md.state_dict_metadata["2.weight"].chunks[0].sizes = torch.Size([1, 8])

    return mlp, edit_dcp_metadata(directory, drop)


def _dcp_damaged_data(tmp_path):
    directory = dcp_save(tmp_path / "ckpt", trained_state())
    data = bytearray((directory / "__0_0.distcp").read_bytes())
    data[-200:] = b"\xff" * 200  # the last tensor's bytes: the others read fine
    (directory / "__0_0.distcp").write_bytes(bytes(data))
    return mlp, directory


def _strict_missing(tmp_path):
    state = trained_state()
    del state["2.bias"]
    return mlp, state


CASES = [_bad_last_shape, _tied_different, _unreadable_dtype, _non_tensor, _short_record,
         _missing_shard, _dcp_partial, _dcp_damaged_data, _strict_missing]


@pytest.mark.parametrize("materialized", [False, True], ids=["deferred", "materialized"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__.strip("_"))
def test_a_failed_load_changes_nothing_and_a_good_load_follows(tmp_path, case, materialized):
    build, bad = case(tmp_path)
    model = deferred(build)
    if materialized:
        torchdefer.materialize_module(model)
    before = snapshot(model)
    with pytest.raises(CheckpointError):
        torchdefer.load_state_dict(model, bad, strict=case is _strict_missing)
    assert_unchanged(model, before)
    good = trained_state(build)
    torchdefer.load_state_dict(model, good, strict=True)
    expected = eager(build)
    expected.load_state_dict(good)
    assert_same_module(model, expected)


def test_a_device_this_process_lacks_for_a_missing_tensor_is_refused_before_loading():
    missing = f"cuda:{torch.cuda.device_count()}"
    model = torchdefer.deferred_init(nn.Linear, 2, 2, device=missing)
    before = snapshot(model)
    with pytest.raises(CheckpointError, match="device="):
        torchdefer.load_state_dict(model, {"weight": torch.zeros(2, 2)})  # bias is missing
    assert_unchanged(model, before)


class FailsLate(dict):
    """A state dict whose last tensor cannot be read (a disk error while preparing)."""

    def __getitem__(self, key):
        if key == "2.bias":
            raise OSError("Input/output error")
        return super().__getitem__(key)


@pytest.mark.parametrize("materialized", [False, True], ids=["deferred", "materialized"])
def test_a_read_failing_after_other_tensors_were_prepared_changes_nothing(materialized):
    model = deferred()
    if materialized:
        torchdefer.materialize_module(model)
    before = snapshot(model)
    with pytest.raises(OSError, match="Input/output"):
        torchdefer.load_state_dict(model, FailsLate(trained_state()))
    assert_unchanged(model, before)
