"""The one registry of inversions (torchdefer/_hooks.py): installed by import, typed errors."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import torchdefer
from torchdefer import _hooks
from torchdefer.errors import CheckpointUsageError, StateError, TorchdeferError

PACKAGE = Path(torchdefer.__file__).parent
HOOKS = [h for h in vars(_hooks).values() if isinstance(h, _hooks.Hook)]


def test_import_torchdefer_installs_every_hook():
    assert {h.name for h in HOOKS} == {"VALUE_READER", "CALL_RUNNER", "SHARDED_MATERIALIZER",
                                       "DISTRIBUTED_LOADER", "SHARDED_WRITER"}
    assert all(h.installed for h in HOOKS), HOOKS


@pytest.mark.parametrize("hook", HOOKS, ids=lambda h: h.name)
def test_an_empty_hook_raises_its_error_and_says_to_import_torchdefer(hook):
    with hook.replaced(None), pytest.raises(TorchdeferError, match="torchdefer") as info:
        hook.get()
    expected = CheckpointUsageError if hook.name in ("DISTRIBUTED_LOADER", "SHARDED_WRITER") \
        else StateError
    assert type(info.value) is expected


def test_replaced_puts_the_previous_function_back_also_when_the_block_raises():
    before = _hooks.VALUE_READER.get()
    with pytest.raises(KeyError), _hooks.VALUE_READER.replaced(lambda t: t):
        raise KeyError("x")
    assert _hooks.VALUE_READER.get() is before


def test_a_data_read_while_recording_goes_through_the_value_reader():
    seen = []
    reader = _hooks.VALUE_READER.get()

    def counting(t):
        seen.append(t)
        return reader(t)

    torch.manual_seed(0)
    eager = torch.randn(3).tolist()
    torch.manual_seed(0)
    with _hooks.VALUE_READER.replaced(counting):
        lazy = torchdefer.deferred_init(lambda: torch.randn(3).tolist())
    assert lazy == eager and len(seen) == 1


def test_no_module_keeps_its_own_hook_setter():
    # The inversions live in _hooks; a `set_<something>` installer elsewhere is a second one.
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("set_") and \
                    node.name.endswith(("reader", "runner", "loader", "writer", "materializer")):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert not found, found
