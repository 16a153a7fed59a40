"""Crafted bad safetensors directories: accelerate's ``load_checkpoint_in_model`` against
``torchdefer.load_state_dict``, class by class. torchdefer is never worse: it refuses
every one with an error naming the file, and changes nothing.

What each did (accelerate 1.15.0, safetensors 0.8.0, torch 2.13; the directory holds
the ``Sequential(Linear, BatchNorm1d, Linear)`` state in three shards with an index;
the bad part is in the last shard, so a tool loading shard by shard has loaded the
first two when it meets it):

=================  ====================================  ===============================
case               accelerate ``load_checkpoint_in_model``  torchdefer ``load_state_dict``
=================  ====================================  ===============================
missing shard      raises, **half-loaded** (shards 1-2)  refuses, unchanged
entry outside dir  **loads the file outside** the dir    refuses, unchanged
duplicate key      loads, **the later file's value**     refuses, unchanged
shape mismatch     raises, **half-loaded**               refuses, unchanged
bad dtype          raises, **half-loaded**               refuses, unchanged
truncated shard    raises, **half-loaded**               refuses, unchanged
stale index key    loads, **the key left at its init**   refuses, unchanged
=================  ====================================  ===============================

The test measures accelerate's outcome each run (``_outcome``) and, on the
versions above, checks it against this table, so the table cannot drift from
what the installed accelerate does there.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from _crafted import (
    assert_unchanged,
    deferred,
    eager,
    raw_safetensors,
    sharded_safetensors,
    snapshot,
    trained_state,
)

import torchdefer
from parity import assert_same_module
from torchdefer.checkpoint import CheckpointError

accelerate = pytest.importorskip("accelerate")
safetensors_torch = pytest.importorskip("safetensors.torch")

SHARDS = [["0.weight", "0.bias"], ["1.weight", "1.bias", "1.running_mean", "1.running_var",
                                   "1.num_batches_tracked"], ["2.weight", "2.bias"]]
LAST = "model-00003-of-00003.safetensors"


def _directory(tmp_path):
    return sharded_safetensors(tmp_path / "ckpt", trained_state(), SHARDS)


def _edit_index(directory, edit):
    path = directory / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    edit(index["weight_map"])
    path.write_text(json.dumps(index))


def _missing_shard(tmp_path):
    directory = _directory(tmp_path)
    os.remove(directory / LAST)
    return directory


def _entry_outside_dir(tmp_path):
    directory = _directory(tmp_path)
    os.rename(directory / LAST, tmp_path / "outside.safetensors")
    _edit_index(directory, lambda m: m.update({"2.weight": "../outside.safetensors",
                                               "2.bias": "../outside.safetensors"}))
    return directory


def _duplicate_key(tmp_path):
    directory = _directory(tmp_path)
    state = trained_state()
    safetensors_torch.save_file({"2.weight": state["2.weight"], "2.bias": state["2.bias"],
                                 "0.weight": torch.zeros(8, 6)}, directory / LAST)
    return directory


def _last_shard(directory, entries):
    state = trained_state()
    raw = {k: ("F32", list(state[k].shape), state[k].numpy().tobytes()) for k in SHARDS[2]}
    raw.update(entries)
    raw_safetensors(directory / LAST, raw)
    return directory


def _shape_mismatch(tmp_path):
    return _last_shard(_directory(tmp_path), {"2.bias": ("F32", [4], b"\0" * 16)})


def _bad_dtype(tmp_path):
    return _last_shard(_directory(tmp_path), {"2.bias": ("F6_E2M3", [3], b"\0" * 3)})


def _truncated_shard(tmp_path):
    directory = _directory(tmp_path)
    data = (directory / LAST).read_bytes()
    (directory / LAST).write_bytes(data[:-16])
    return directory


def _stale_index_key(tmp_path):
    directory = _directory(tmp_path)
    state = trained_state()
    safetensors_torch.save_file({"2.weight": state["2.weight"]}, directory / LAST)  # 2.bias gone
    return directory


# case -> what accelerate 1.15.0 does (the table above)
ACCELERATE_1_15 = {
    _missing_shard: "raises, half-loaded",
    _entry_outside_dir: "loads the file outside",
    _duplicate_key: "loads, a value not the index's",
    _shape_mismatch: "raises, half-loaded",
    _bad_dtype: "raises, half-loaded",
    _truncated_shard: "raises, half-loaded",
    _stale_index_key: "loads, a key left at its init",
}


def _outcome(case, tmp_path) -> str:
    """What ``load_checkpoint_in_model`` does with ``case``'s directory, in words."""
    from accelerate.utils import load_checkpoint_in_model

    directory = case(tmp_path)
    model = eager()
    before = snapshot(model)
    try:
        load_checkpoint_in_model(model, str(directory))
    except Exception:
        try:
            assert_unchanged(model, before)
        except AssertionError:
            return "raises, half-loaded"
        return "raises, unchanged"
    good = trained_state()
    state = model.state_dict()
    if case is _entry_outside_dir and torch.equal(state["2.weight"], good["2.weight"]):
        return "loads the file outside"
    wrong = [k for k in good if not torch.equal(state[k], good[k])]
    left = [k for k in wrong if torch.equal(state[k], before[k][2])]
    if left:
        return "loads, a key left at its init"
    return "loads, a value not the index's" if wrong else "loads"


@pytest.mark.parametrize("case", list(ACCELERATE_1_15), ids=lambda c: c.__name__.strip("_"))
def test_torchdefer_refuses_every_bad_directory_accelerate_half_loads_or_misloads(
        tmp_path, case):
    observed = _outcome(case, tmp_path / "accelerate")
    assert observed != "loads", f"{case.__name__} is not a bad input for accelerate either"
    if accelerate.__version__ == "1.15.0":
        assert observed == ACCELERATE_1_15[case], "the table in the docstring is out of date"
    for materialized in (False, True):
        directory = case(tmp_path / f"torchdefer-{materialized}")
        model = deferred()
        if materialized:
            torchdefer.materialize_module(model)
        before = snapshot(model)
        with pytest.raises(CheckpointError) as info:
            torchdefer.load_state_dict(model, directory)
        named = (LAST, "outside", "model.safetensors.index.json")
        assert any(n in str(info.value) for n in named), info.value
        assert_unchanged(model, before)
        good = trained_state()
        torchdefer.load_state_dict(model, good, strict=True)
        expected = eager()
        expected.load_state_dict(good)
        assert_same_module(model, expected)
