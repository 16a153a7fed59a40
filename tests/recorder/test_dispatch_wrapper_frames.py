"""The fast paths find the user's line past the recording mode's dispatch wrappers unwalked.

``recorder._fast``, called by the recording mode, asks ``user_frame`` to jump over
``RecordingMode.__torch_dispatch__`` and the frames between it and the
dispatcher (``mode.DISPATCH_FRAMES``);
the answer must be the frame-by-frame walk's, also where user code sits
between the op and the recording (a user's dispatch mode, a user's
``__torch_function__`` subclass) and after ``deferred_init`` returned.
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchdefer
from torchdefer import _compat
from torchdefer.fake._source import is_library_code
from torchdefer.recorder import _mode as mode
from torchdefer.recorder._entries import ENTRIES


class _UserMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))  # the innermost user frame of the ops below


def _plain():
    w = torch.empty(4, 4)
    w.normal_(0, 0.02)
    w.uniform_(-1, 1)
    w.fill_(1.0)
    return torch.nn.Parameter(w)


def _under_user_mode():
    with _UserMode():
        return _plain()


def _nn_init():
    m = torch.nn.Linear(3, 5)
    torch.nn.init.normal_(m.weight, std=0.02)
    torch.nn.init.ones_(m.bias)
    return m


def _sources(out):
    tensors = list(out.parameters()) if isinstance(out, torch.nn.Module) else [out]
    graph = tensors[0]._graph
    nodes, seen = [], set()
    for t in tensors:
        node = t._value.node
        while node is not None and node.seq not in seen:
            seen.add(node.seq)
            nodes.append(node)
            node = node.inputs[0].node if node.inputs else None
    assert graph is not None
    return sorted((n.seq, n.op, n.source) for n in nodes)


def _walked(monkeypatch, build):
    """The sources when every frame is walked (no jump: DISPATCH_FRAMES is 0)."""
    with monkeypatch.context() as m:
        m.setattr(_compat, "dispatch_wrapper_frames", lambda cls: -1)
        sources = _sources(torchdefer.deferred_init(build))
        assert mode.DISPATCH_FRAMES == 0
    return sources


@pytest.mark.parametrize("build", [_plain, _under_user_mode, _nn_init])
def test_fast_path_sources_are_those_of_the_frame_by_frame_walk(monkeypatch, build):
    jumped = _sources(torchdefer.deferred_init(build))
    assert mode.DISPATCH_FRAMES >= 1  # the jump was on: the mode's own frame at least
    assert jumped == _walked(monkeypatch, build)
    assert all(source is not None and source.file == __file__ for _, _, source in jumped)


def test_a_users_dispatch_mode_is_the_innermost_user_frame():
    out = torchdefer.deferred_init(_under_user_mode)
    node = out._value.node
    assert node.source.function == "__torch_dispatch__"
    raw = _UserMode.__dict__["__torch_dispatch__"]
    raw = getattr(raw, "__wrapped__", raw)  # torch wraps a mode's __torch_dispatch__
    assert node.source.line == raw.__code__.co_firstlineno + 1


def test_ops_after_deferred_init_name_the_users_line():
    p = torchdefer.deferred_init(_plain)
    with torch.no_grad():
        line = sys._getframe().f_lineno + 1
        p.normal_()  # recorded by the deferred tensor's own __torch_dispatch__
    source = p._value.node.source
    assert (source.file, source.line, source.function) == (
        __file__, line, sys._getframe().f_code.co_name)


def test_the_frames_jumped_over_are_library_code(monkeypatch):
    attribute = mode.RecordingMode.__dict__["__torch_dispatch__"]
    code = getattr(attribute, "__wrapped__", attribute).__code__
    jumped: list = []
    counts: set = set()

    def spied(fast):
        def spy(graph, func, args, kwargs, above):
            frame = sys._getframe(1)  # the mode's own __torch_dispatch__
            assert frame.f_code is code
            jumped.append(code)
            for _ in range(above - 1):
                frame = frame.f_back
                jumped.append(frame.f_code)
            counts.add(above)
            return fast(graph, func, args, kwargs, above)

        return spy

    monkeypatch.setattr(ENTRIES, "fast_ops", {k: spied(f) for k, f in ENTRIES.fast_ops.items()})
    torchdefer.deferred_init(_nn_init)
    assert counts == {mode.DISPATCH_FRAMES}
    if hasattr(attribute, "__wrapped__"):  # torch wraps it (2.12+): its wrappers too
        assert mode.DISPATCH_FRAMES >= 2
    assert all(is_library_code(c) for c in jumped)
