"""The one restoring helper for temporary patches (torchdefer/_compat/patch.py)."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdefer
from test_compat import _dotted  # one reading of dotted names for both AST checks
from torchdefer._compat.patch import KEEP, MISSING, SharedPatches, attribute, patched, setting

PACKAGE = Path(torchdefer.__file__).parent


class Base:
    def hello(self) -> str:
        return "base"


class Child(Base):
    pass


def test_an_inherited_attribute_is_deleted_again_not_copied_onto_the_owner():
    with pytest.raises(KeyError), patched(attribute(Child, "hello"), lambda self: "patched") as b:
        assert b is MISSING and Child().hello() == "patched"
        raise KeyError("the body fails")
    assert "hello" not in vars(Child) and Child().hello() == "base"


def test_an_own_attribute_is_put_back_as_the_same_object():
    original = vars(Base)["hello"]
    with patched(attribute(Base, "hello"), lambda self: "patched"):
        assert Base().hello() == "patched"
    assert vars(Base)["hello"] is original


def test_keep_writes_nothing_and_restores_what_the_body_changed():
    writes = []
    box = [1]
    slot = setting(lambda: box[0], lambda v: (writes.append(v), box.__setitem__(0, v)))
    with patched(slot, KEEP):
        box[0] = 5
    assert box == [1] and writes == [1]
    with patched(slot, 1):  # already 1: nothing to write, nothing to restore
        pass
    assert writes == [1]


def test_restore_if_false_leaves_a_change_the_block_does_not_own():
    before = torch.get_default_dtype()
    slot = setting(torch.get_default_dtype, torch.set_default_dtype)
    try:
        with patched(slot, restore_if=lambda now: False):
            torch.set_default_dtype(torch.float64)
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(before)


def test_shared_patches_stay_until_the_last_thread_leaves_in_any_order():
    shared = SharedPatches(lambda stack: stack.enter(
        patched(attribute(Child, "hello"), lambda self: "patched")))
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def first():
        with shared.held():
            first_in.set()
            second_in.wait()
        first_out.set()

    def second():
        first_in.wait()
        with shared.held():
            second_in.set()
            first_out.wait()
            seen.append(Child().hello())  # the first one left: still in

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == ["patched"] and "hello" not in vars(Child) and not shared.active


def _bindings():
    return (vars(torch.Tensor).get("data"), vars(torch.Tensor).get("_make_subclass"),
            threading.Thread.start, torch.set_default_dtype, torch.set_default_tensor_type,
            nn.init._no_grad_trunc_normal_, torch.get_default_dtype(), torch.get_num_threads())


def test_a_failing_deferred_init_leaves_every_patched_binding_as_found():
    before = _bindings()

    def build():
        torch.set_default_dtype(torch.float64)
        w = nn.Parameter(torch.empty(3, 3))
        nn.init.trunc_normal_(w)
        assert vars(torch.Tensor).get("data") is not None  # patched while recording
        raise ValueError("user code fails")

    with pytest.raises(ValueError, match="user code fails"):
        torchdefer.deferred_init(build)
    assert _bindings() == before


def test_a_recording_thread_ending_first_leaves_trunc_normal_marked_for_another():
    # Thread A's block ends while B's still records: B's trunc_normal_ stays a
    # composite (no data read), and its values are eager's.
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    out = {}

    def a():
        def build():
            a_in.set()
            b_in.wait()
            return torch.zeros(2)
        torchdefer.deferred_init(build)
        a_out.set()

    def b():
        def build():
            a_in.wait()
            b_in.set()
            a_out.wait()
            return nn.init.trunc_normal_(torch.empty(5, 5))
        torch.manual_seed(0)
        out["w"] = torchdefer.deferred_init(build)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not out["w"]._graph.observations
    torch.manual_seed(0)
    eager = nn.init.trunc_normal_(torch.empty(5, 5))
    assert torch.equal(torchdefer.materialize_tensor(out["w"]), eager)


# Writes to torch's or threading's attributes outside the helper, each with its reason.
ALLOWED = {
    # permanent, not temporary: deferred tensors outlive the recording
    ("recorder/_threads.py", "torch.Tensor.set_"),
    # AmbientSwitch applies a node's settings one after another and puts the
    # caller's back on exit; a setting with no setter function
    ("recorder/_ambient.py", "torch.utils.deterministic.fill_uninitialized_memory"),
}




def test_torch_and_threading_are_patched_only_through_the_helper():
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("_compat/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("setattr", "delattr") and node.args:
                targets = [ast.Attribute(node.args[0], "<name>")]
            for t in targets:
                name = _dotted(t) if isinstance(t, ast.Attribute) else None
                if name and name.split(".")[0] in ("torch", "threading") and \
                        (rel, name) not in ALLOWED:
                    found.append(f"{rel}:{node.lineno} {name}")
    assert not found, "use torchdefer._compat.patch.patched:\n" + "\n".join(found)
