"""The door on deferred tensors (recorder/_target.py): what one stands for, marking it real."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.errors import TorchdeferError
from torchdefer.materialize import Replay
from torchdefer.materialize._plan import make_plan, recorded_slice
from torchdefer.recorder import RecordingError, Target, mark_materialized, target_of

PACKAGE = Path(torchdefer.__file__).parent


def test_target_replayed_gives_the_eager_value():
    torch.manual_seed(0)
    eager = nn.Linear(4, 3)
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(nn.Linear, 4, 3)
    target = target_of(lazy.weight)
    real = Replay(target.graph, None).run([target.key])[0]
    assert torch.equal(real, eager.weight)
    assert target.meta.size == tuple(eager.weight.shape)


def test_target_keeps_its_version_after_a_later_write():
    torch.manual_seed(0)
    eager = nn.Linear(4, 3)
    with torch.no_grad():
        eager.weight.mul_(2)
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(nn.Linear, 4, 3)
    before = target_of(lazy.weight)
    with torch.no_grad():
        lazy.weight.mul_(2)
    after = target_of(lazy.weight)
    assert after.version == before.version + 1
    assert after.storage is before.storage
    assert before.version == after.version - 1  # the older target names the older version
    assert torch.equal(Replay(after.graph, None).run([after.key])[0], eager.weight)


def test_target_of_a_real_tensor_is_refused_as_a_type_error():
    with pytest.raises(TorchdeferError, match="expects a deferred tensor") as info:
        target_of(torch.zeros(2))
    assert isinstance(info.value, TypeError)


def test_target_is_frozen():
    lazy = torchdefer.deferred_init(torch.zeros, 3)
    target = target_of(lazy)
    with pytest.raises(AttributeError):
        target.version = 7  # type: ignore[misc]
    assert isinstance(target, Target)


def test_mark_materialized_refuses_later_recorded_writes_and_undo_lifts_it():
    lazy = torchdefer.deferred_init(nn.Linear, 4, 3)
    undo = mark_materialized(lazy.weight)
    assert target_of(lazy.weight).materialized
    with pytest.raises(RecordingError, match="already materialized"), torch.no_grad():
        lazy.weight.add_(1)
    undo()
    assert not target_of(lazy.weight).materialized
    with torch.no_grad():
        lazy.weight.add_(1)  # recorded again


def test_mark_materialized_undo_leaves_what_was_marked_before():
    lazy = torchdefer.deferred_init(nn.Linear, 4, 3)
    mark_materialized(lazy.weight)
    undo = mark_materialized(lazy.weight, target_of(lazy.bias))
    undo()
    assert target_of(lazy.weight).materialized  # marked before: still marked
    assert not target_of(lazy.bias).materialized


def test_materialize_module_marks_through_the_door():
    lazy = torchdefer.deferred_init(nn.Linear, 4, 3)
    weight = lazy.weight
    storage = target_of(weight).storage
    torchdefer.materialize_module(lazy)
    assert storage.materialized


def test_recorded_slice_lists_what_an_empty_cache_plan_lists():
    from torchdefer.materialize._cache import ReplayCache

    lazy = torchdefer.deferred_init(lambda: nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))
    for t in (lazy[0].weight, lazy[1].bias):
        key = target_of(t).key
        assert recorded_slice([key]) == make_plan([key], ReplayCache(), "recorded", None).nodes


# ---- the rule: packages outside the recorder use the door, not the fields --------


def _attribute_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in ("_value", "_graph"):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == "materialized":
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .materialized =")
    return found


def test_no_package_outside_the_recorder_reads_a_deferred_tensors_fields():
    outside = [p for p in PACKAGE.rglob("*.py") if "recorder" not in p.relative_to(PACKAGE).parts]
    uses = [use for p in outside for use in _attribute_uses(p)]
    assert not uses, "use torchdefer.recorder.target_of / mark_materialized:\n" + "\n".join(uses)


def test_viz_slices_without_materializes_cache():
    for path in (PACKAGE / "viz").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "torchdefer.materialize._cache" not in names, path
