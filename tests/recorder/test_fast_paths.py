"""The one-step recording of plain fills and detach (recorder/_fast.py) gives the general path's graph.

Each program is recorded twice, with the fast path and without it
(the mode's and ``record_call``'s tables emptied): the recorded graphs must agree field by field,
errors must agree in type and words, and the materialized values and the
generator's end state must be eager's.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchdefer
from parity import check_program
from torchdefer.recorder import _record as record
from torchdefer.recorder._entries import ENTRIES
from torchdefer.recorder._graph import Graph, Value

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
           torch.complex64, torch.bool]
_NUMBERS = st.one_of(
    st.floats(-3, 3), st.integers(-5, 5), st.booleans(),
    st.sampled_from([0.0, -0.0, 1e300, -1e300, 7e4, math.inf, -math.inf, math.nan, 2**70]),
)
_MODES = st.sampled_from(["grad", "no_grad", "inference"])
_OPS = st.one_of(
    st.tuples(st.sampled_from(["normal_", "uniform_"]), st.lists(_NUMBERS, max_size=2),
              _MODES),
    st.tuples(st.just("fill_"), st.lists(_NUMBERS, min_size=1, max_size=1), _MODES),
    st.tuples(st.just("detach"), st.just([]), _MODES),
    # argument counts eager refuses
    st.tuples(st.sampled_from(["normal_", "uniform_", "fill_"]), st.lists(_NUMBERS, max_size=3),
              _MODES),
)


_MODE_CONTEXTS = {"grad": torch.enable_grad, "no_grad": torch.no_grad,
                  "inference": torch.inference_mode}


def _program(dtype, view, device, grad, ops, errors, inference_base=False, factory="empty",
             how="explicit"):
    """A tensor of ``dtype`` (maybe a view, a parameter) filled by ``ops``; their
    errors, in words, appended to ``errors``."""

    def build():
        make = getattr(torch, factory)
        with torch.inference_mode(inference_base):
            if how == "explicit":
                base = make(4, 6, dtype=dtype, device=device)
            elif how == "context":  # the device from torch.device's mode, dtype from default
                with torch.device(device):
                    base = make((4, 6))
            else:  # dtype=None given: the default dtype
                base = make([4, 6], dtype=None)
        if grad and base.dtype.is_floating_point and not inference_base:
            base = torch.nn.Parameter(base)
        t = {"whole": base, "t": base.t(), "slice": base[1:3], "expand": base[:1].expand(3, 6),
             "conj": base.conj()}[view]
        kept = []
        for name, numbers, mode in ops:
            try:
                with _MODE_CONTEXTS[mode]():
                    if name == "detach":
                        t = t.detach()
                        kept.append(t)
                    else:
                        getattr(t, name)(*numbers)
            except Exception as e:  # compared with the other path's
                errors.append((type(e), str(e)))
        return base, t, *kept

    return build


def _dump(tensors):
    """Every node reachable from ``tensors``, as comparable plain data."""
    nodes, todo = {}, [t._value.node for t in tensors]
    while todo:
        node = todo.pop()
        if node.seq in nodes:
            continue
        nodes[node.seq] = node
        todo.extend(v.node for v in node.inputs)
        for v in node.outputs:
            todo.extend(v.storage.writers)
            todo.append(v.storage.creator)
    return [_node_fields(nodes[seq]) for seq in sorted(nodes)]


def _node_fields(node):
    def leaf(x):
        return ("value", x.node.seq, x.index) if isinstance(x, Value) else (type(x), repr(x))

    rng = None if node.rng is None else (node.rng.stream.device, node.rng.epoch, node.rng.index)
    return (node.seq, node.kind, str(node.op), [leaf(x) for x in node.leaves], node.spec,
            [leaf(v) for v in node.inputs], node.reads,
            [(s.id, version) for s, version in node.writes],
            [(v.index, v.storage.id, v.storage.nbytes, v.meta) for v in node.outputs],
            rng, node.source, node.ambient, type(node.payload))


def _general_path_only(m):
    """Empty both tables of one-step recorders: the mode's and ``record_call``'s."""
    m.setattr(record, "FAST_OPS", {})
    m.setattr(ENTRIES, "fast_ops", {})


def test_emptied_tables_leave_the_general_path_alone(monkeypatch):
    # Else the comparisons below would compare the fast path with itself.
    callers: set[str] = set()
    original = Graph.add_node

    def spy(self, *args, **kwargs):
        callers.add(sys._getframe(1).f_code.co_name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Graph, "add_node", spy)
    fast = {"fast_fill", "fast_detach", "fast_factory"}
    with monkeypatch.context() as m:
        _general_path_only(m)
        torchdefer.deferred_init(torch.nn.Linear, 4, 4)
    assert callers and not callers & fast
    callers.clear()
    torchdefer.deferred_init(torch.nn.Linear, 4, 4)
    assert fast <= callers


def _record(program, fast, monkeypatch):
    errors = []
    with monkeypatch.context() as m:
        if not fast:
            _general_path_only(m)
        torch.manual_seed(0)
        out = torchdefer.deferred_init(program(errors))
        return _dump(out), errors, torch.get_rng_state()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(_DTYPES),
       view=st.sampled_from(["whole", "whole", "t", "slice", "expand", "conj"]),
       device=st.sampled_from(["cpu", "cpu", "cuda", "meta"]), grad=st.booleans(),
       inference_base=st.sampled_from([False, False, True]),
       factory=st.sampled_from(["empty", "ones", "zeros"]),
       how=st.sampled_from(["explicit", "explicit", "context", "none"]),
       ops=st.lists(_OPS, min_size=1, max_size=4))
def test_fast_paths_record_the_general_paths_graph(dtype, view, device, grad, inference_base,
                                                   factory, how, ops, monkeypatch):
    if view == "conj" and not (dtype.is_complex and how == "explicit"):
        view = "whole"
    def program(errors):
        return _program(dtype, view, device, grad, ops, errors, inference_base, factory, how)

    fast, slow = _record(program, True, monkeypatch), _record(program, False, monkeypatch)
    assert fast[1] == slow[1]  # the same errors
    assert fast[0] == slow[0]
    assert torch.equal(fast[2], slow[2])  # the generator left in the same place


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_fast_fills_replay_as_eager(dtype):
    def program(defer):
        def build():
            layers = [torch.nn.Linear(8, 6, dtype=dtype) for _ in range(3)]
            norm = torch.nn.Parameter(torch.empty(6, dtype=dtype))
            with torch.no_grad():
                for layer in layers:
                    layer.weight.normal_(0.0, 0.02)
                    layer.bias.uniform_(-0.5, 0.5)
                norm.fill_(1.0)
                layers[1].weight.fill_(-2)
            return layers, norm

        return defer(build)

    check_program(program)
    check_program(program, order=[5, 0, 3])


def test_the_draw_key_leaves_out_only_numbers_that_choose_no_code_path():
    from torchdefer.rng import draws

    for func in (torch.ops.aten.normal_.default, torch.ops.aten.uniform_.default):
        numbers = {a.name for a in func._schema.arguments[1:] if a.name != "generator"}
        assert numbers <= set(draws._PATH_FREE[func.overloadpacket])


@pytest.mark.parametrize("size", [5, 16, 17, 40])
def test_fast_fills_of_one_shape_and_many_numbers_replay_as_eager(size):
    # One draw answer serves every std and bound of a shape: the small sizes
    # take the cached-normal path, whose effect depends on the state, not the numbers.
    def program(defer):
        def build():
            ws = [torch.nn.Parameter(torch.empty(size)) for _ in range(6)]
            with torch.no_grad():
                for i, w in enumerate(ws):
                    if i % 3 == 2:
                        w.uniform_(-i, i + 0.5)
                    else:
                        w.normal_(i * 0.5, 0.01 * (i + 1))
            return ws

        return defer(build)

    check_program(program)
    check_program(program, order=[5, 1, 3])


def test_fast_fills_outside_deferred_init_move_the_generator_at_once():
    m = torchdefer.deferred_init(torch.nn.Linear, 5, 5)
    torch.manual_seed(1)
    m.weight.data.normal_(0, 0.1)
    after = torch.get_rng_state()
    eager = torch.nn.Linear(5, 5)
    torch.manual_seed(1)
    eager.weight.data.normal_(0, 0.1)
    assert torch.equal(after, torch.get_rng_state())
    torchdefer.materialize_module(m)
    assert torch.equal(m.weight, eager.weight)


def test_fast_factories_record_the_default_dtype_at_their_call():
    def program(defer):
        def build():
            previous = torch.get_default_dtype()
            torch.set_default_dtype(torch.float64)
            try:
                a = torch.empty(3, 2).normal_()
                b = torch.ones(4, dtype=None)
            finally:
                torch.set_default_dtype(previous)
            c = torch.zeros([2, 2]).uniform_(-1, 1)
            return a, b, c

        return defer(build)

    check_program(program)


@pytest.mark.parametrize("make", [
    lambda: torch.empty(-1),
    lambda: torch.ones(2, -3),
    lambda: torch.zeros([2**62, 2**62]),
    lambda: torch.empty(3, dtype=torch.float32, device="cpu", pin_memory=True),
    lambda: torch.empty(2, 2).fill_(torch.tensor(1.0)),
    lambda: torch.empty(2, 2).normal_(0, -1),
    lambda: torch.empty(2, 2).uniform_(1, 0),
    lambda: torch.empty(2, 2, dtype=torch.float16).fill_(1e6),
])
def test_fast_paths_raise_the_general_paths_errors(make, monkeypatch):
    def outcome(fast):
        with monkeypatch.context() as m:
            if not fast:
                _general_path_only(m)
            torch.manual_seed(0)
            try:
                out = torchdefer.deferred_init(make)
            except Exception as e:
                return type(e), str(e), torch.get_rng_state()
            return _dump([out]), None, torch.get_rng_state()

    fast, slow = outcome(True), outcome(False)
    assert fast[:2] == slow[:2]
    assert torch.equal(fast[2], slow[2])


def test_the_fast_ops_on_real_meta_tensors_run_as_eager_code():
    # The mode tries its one-step recorders before it asks whether a call is on
    # real meta tensors only: none of them takes one.
    def build():
        with torch.device("meta"):
            t = torch.tensor([1.0, 2.0])  # a real meta tensor, as in eager
        same = t.normal_().uniform_(-1, 1).fill_(2.0)
        return t, same, t.detach(), torch.nn.Parameter(t)

    t, same, detached, param = torchdefer.deferred_init(build)
    assert same is t
    for x in (t, detached, param):
        assert not torchdefer.is_deferred(x) and x.is_meta and x.shape == (2,)
    assert type(param) is torch.nn.Parameter
