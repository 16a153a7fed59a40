"""The caches of the per-op recording path give what the uncached path gave.

Recording remembers, per op or per call signature, what cannot change between
calls (recorder/_facts.py, the draw effects of stream.call_effect, the library
test of user_frame, the functions that need no special case, dynamo's
disable wrapper). Each test makes the remembered answer meet a call where a
wrong reuse would show: against eager PyTorch, as everywhere.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_tensor, build_both
from parity import check_program as check
from torchdefer.recorder._graph import SourceLocation


def test_a_generator_argument_is_drawn_from_after_the_ops_facts_are_cached():
    def build():
        g = torch.Generator().manual_seed(3)
        out = []
        for _ in range(3):  # the op's facts are cached after the first call
            out.append(torch.randn(4, 4, generator=g))
            out.append(torch.empty(5).normal_(0, 1, generator=g))
            out.append(torch.empty(6).uniform_(-1, 1, generator=g))
        out.append(torch.randn(4, 4))  # and the default generator is untouched by them
        return out, g

    check(lambda defer: defer(build))


def test_repeated_random_calls_of_one_signature_draw_as_eager_with_jumps_off_midway(monkeypatch):
    # The draw effect of a signature is remembered; turning the draw model off
    # must still take effect for signatures seen before.
    def build():
        a = [torch.empty(64, 64).normal_() for _ in range(3)]
        monkeypatch.setenv("TORCHDEFER_RNG_JUMPS", "0")
        b = [torch.empty(64, 64).normal_() for _ in range(3)]
        monkeypatch.delenv("TORCHDEFER_RNG_JUMPS")
        return a + b + [torch.randn(3)]

    check(lambda defer: defer(build))


def test_same_shape_different_strides_are_different_draw_signatures():
    def build():
        x = torch.empty(32, 32).normal_()
        y = torch.empty(32, 32).t().normal_()  # strided: the serial path
        z = torch.empty(32, 32).normal_()
        return x, y, z

    check(lambda defer: defer(build))


def test_nn_parameter_of_a_deferred_parameter_after_many_plain_detaches():
    # detach is never remembered as an ordinary function: a deferred
    # Parameter's detach inside nn.Parameter keeps its class.
    def build():
        layers = [nn.Linear(4, 4) for _ in range(3)]
        plain = [layer.weight.detach() for layer in layers]
        return layers, plain

    eager, deferred = build_both(build)
    again = nn.Parameter(deferred[0][0].weight)
    assert isinstance(again, nn.Parameter) and again is not deferred[0][0].weight
    for real, ref in zip(deferred[1], eager[1], strict=True):
        assert_same_tensor(torchdefer.materialize_tensor(real), ref)
    assert_same_tensor(torchdefer.materialize_tensor(again), eager[0][0].weight)


def test_in_place_write_into_a_real_tensor_still_refused_after_many_recorded_ones():
    def build():
        x = torch.zeros(3)
        for _ in range(3):
            x.add_(1)
        return x

    deferred = torchdefer.deferred_init(build)
    real = torch.zeros(3)
    real.add_(deferred)  # eager code writes now: the deferred value is computed
    assert torch.equal(real, torch.full((3,), 3.0))


def test_in_place_writes_remembered_while_recording_are_recorded_and_refused_into_real_tensors():
    # nn.init's functions and in-place methods skip __torch_function__'s special
    # cases while a recording is active, once seen: they still draw as eager, and a
    # write into a real tensor is still refused by the recorder, not run.
    def build():
        layers = [nn.Linear(4, 4) for _ in range(3)]
        for layer in layers:
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.ones_(layer.bias)
            with torch.no_grad():
                layer.weight.fill_(0.5).uniform_(-1, 1)
        return layers, torch.randn(3)

    check(lambda defer: defer(build))
    real = torch.zeros(4)

    def writes_real():
        deferred = torch.ones(4)
        for _ in range(3):
            deferred.copy_(torch.ones(4))
        real.copy_(deferred)  # not a write of eager's kind here: refused

    with pytest.raises(torchdefer.TorchdeferError, match="real tensor"):
        torchdefer.deferred_init(writes_real)
    assert torch.equal(real, torch.zeros(4))


def test_errors_name_the_users_line_after_the_frame_cache_is_warm():
    pytest.importorskip("torch.distributed._functional_collectives")

    def build():
        for _ in range(3):
            torch.empty(2, 3).add_(1)
        torch.ops._c10d_functional.all_reduce.default(torch.ones(4), "sum", "0")  # the bad line

    line = build.__code__.co_firstlineno + 3
    with pytest.raises(torchdefer.TorchdeferError, match=f"{__file__}:{line} in build"):
        torchdefer.deferred_init(build)
    node = torchdefer.deferred_init(lambda: torch.empty(2) + 1)._value.node
    assert node.source is not None and node.source.file == __file__


def test_a_compiled_function_inside_deferred_init_computes_eagers_values_without_warnings():
    def f(x):
        return (x * 2).sin() + 1

    compiled = torch.compile(f, backend="eager")

    def build():
        return compiled(torch.ones(4)), nn.Linear(4, 4)

    eager = build()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.manual_seed(0)
        ref = nn.Linear(4, 4)
        torch.manual_seed(0)
        out, layer = torchdefer.deferred_init(build)
    assert_same_tensor(torchdefer.materialize_tensor(out), eager[0])
    torchdefer.materialize_module(layer)
    assert_same_tensor(layer.weight, ref.weight)


def test_data_and_storage_reads_are_answered_the_same_after_many_calls():
    # .data and the storage getters need work after the call: they never take
    # the ordinary shortcut, however often they are called.
    def build():
        x = torch.arange(6.0).view(2, 3)
        seen = []
        for _ in range(4):
            d = x.data
            seen.append((d._value.node.kind, x.untyped_storage().nbytes(),
                         x.untyped_storage().device))
        return x, d, seen

    x, d, seen = torchdefer.deferred_init(build)
    assert seen == [("data_get", 24, torch.device("cpu"))] * 4
    assert torchdefer.is_fake(d) and d.untyped_storage().device == torch.device("cpu")
    assert torch.equal(torchdefer.materialize_tensor(d), torch.arange(6.0).view(2, 3))


def test_a_collective_is_refused_at_the_call_also_after_its_facts_are_cached():
    functional = pytest.importorskip("torch.distributed._functional_collectives")
    del functional

    def build():
        x = torch.ones(4)
        torch.ops._c10d_functional.all_reduce.default(x, "sum", "0")

    for _ in range(2):  # computes the op's facts, then reads them
        with pytest.raises(torchdefer.TorchdeferError, match="all_reduce"):
            torchdefer.deferred_init(build)


def test_normal_and_uniform_after_a_resize_a_set_and_through_a_view_keep_eagers_layout():
    # normal_/uniform_ run no kernel while recording: their tensor keeps the
    # metadata it was last recorded with, which must be what it is after a
    # resize_, a set_ and through a transposed view.
    def build():
        x = torch.empty(2, 3)
        x.resize_(4, 5)
        x.normal_()
        y = torch.empty(6)
        x.set_(y.untyped_storage(), 0, (2, 3))
        x.uniform_(-1, 1)
        v = x.t()
        v.normal_(2, 3)
        return x, y, v

    check(lambda defer: defer(build))


def _line() -> int:
    """The caller's line, as its frame reports it."""
    return sys._getframe(1).f_lineno


def _one_line_fills():
    out, lines = [], []
    for _ in range(3):  # the line of each instruction offset is kept after the first
        out.append(torch.empty(2).fill_(1.0)); lines.append(_line())  # noqa: E702
        out.append(torch.empty(3).normal_(0.0, 1.0)); lines.append(_line())  # noqa: E702
        out.append(torch.empty(4).uniform_()); lines.append(_line())  # noqa: E702
    return out, lines


def _multi_line_fills():
    out = []
    for _ in range(3):
        out.append(torch.empty(3).normal_(
            0.0,
            1.0))
        out.append(
            torch.empty(4).uniform_(-1.0,
                                    1.0))
    return out


def _sources(out):
    return [t._value.node.source for t in out]


def test_recorded_source_lines_are_the_frames_lines_after_the_line_cache_is_warm():
    out, lines = torchdefer.deferred_init(_one_line_fills)
    assert _sources(out) == [SourceLocation(__file__, n, "_one_line_fills") for n in lines]
    assert len(set(lines)) == 3


def test_recorded_source_lines_of_calls_over_several_lines_are_the_frames_lines():
    # Under a tracer user_frame asks each frame its line (f_lineno), as before
    # the line cache; the cached answers must be the same.
    warm = _sources(torchdefer.deferred_init(_multi_line_fills))
    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: None)
    try:
        traced = _sources(torchdefer.deferred_init(_multi_line_fills))
    finally:
        sys.settrace(previous)
    assert warm == traced
    assert warm[:2] == warm[2:4] == warm[4:]
    assert all(s.file == __file__ and s.function == "_multi_line_fills" for s in warm)


def test_draws_on_cpu_and_cpu_0_share_the_default_generators_stream_as_in_eager():
    # The ledger finds a default stream by the device object: cpu and cpu:0 are
    # two keys of the one stream.
    def build():
        out = []
        for device in ("cpu", torch.device("cpu", 0), torch.device("cpu"), "cpu:0"):
            out.append(torch.randn(3, device=device))
            out.append(torch.empty(5, device=device).normal_())
        return out

    check(lambda defer: defer(build))


def test_shared_tensor_metas_are_told_apart_by_every_field():
    """TensorMeta.of shares one object per distinct layout: tensors that differ only in
    stride, offset, dtype, device, conj or neg bits keep their own, and replay as eager."""

    def build():
        base = torch.empty(4, 6)
        z = torch.empty(4, 6, dtype=torch.complex64)
        out = [torch.empty(4, 6), torch.empty(4, 6, dtype=torch.float64), base.t(),
               base[1:], base.view(6, 4), z.conj()]
        for t in (out[0], out[1], base, z):
            t.normal_()
        out += [base, z, z.conj().imag, z._neg_view()]
        return out

    check(lambda defer: defer(build))
    model = torchdefer.deferred_init(build)
    metas = [t._value.meta for t in model]
    seen: dict = {}
    for meta in metas:  # equal metadata is one object; different metadata is not
        assert seen.setdefault(meta, meta) is meta
    from torchdefer.recorder._graph import TensorMeta
    with torchdefer.fake_mode():
        a, b = torch.empty(2, 3), torch.empty(2, 3, device="cuda")
    assert TensorMeta.of(a, a.device) is TensorMeta.of(a, a.device)
    assert TensorMeta.of(b, b.device) != TensorMeta.of(a, a.device)
    assert TensorMeta.of(b, b.device).device == torch.device("cuda", 0)


def test_tensor_meta_sharing_is_bounded(monkeypatch):
    from torchdefer.recorder import _graph as graph

    monkeypatch.setattr(graph, "_METAS_KEPT", 8)
    with torchdefer.fake_mode():
        for n in range(1, 40):
            t = torch.empty(n)
            assert graph.TensorMeta.of(t, t.device).size == (n,)
    assert len(graph._metas) <= 8


class _Logging(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class _Plain(torch.Tensor):  # an eager tensor subclass: nn.Parameter detaches it too
    pass


def test_a_torch_function_mode_sees_grad_fn_and_requires_grad_as_in_eager():
    # DeferredTensor answers them before __torch_function__; a mode still sees them.
    def build():
        t = torch.empty(3)
        if not torchdefer.is_deferred(t):
            t = t.as_subclass(_Plain)
        with _Logging() as mode:
            p = nn.Parameter(t)
            module = nn.Module()
            module.weight = p
            p.requires_grad_(False)
            _ = p.grad_fn
        return mode.seen

    eager = build()
    deferred = torchdefer.deferred_init(build)
    assert deferred == eager and "requires_grad_" in eager and "__get__" in eager


class _OwnParameter(nn.Parameter):
    calls: list = []

    def requires_grad_(self, requires_grad=True):
        _OwnParameter.calls.append(requires_grad)
        return super().requires_grad_(requires_grad)

    @property
    def grad_fn(self):
        _OwnParameter.calls.append("grad_fn")
        return None

    def detach(self):
        _OwnParameter.calls.append("detach")
        return super().detach()


def test_a_parameter_subclass_keeps_its_own_grad_fn_requires_grad_and_detach():
    def build():
        p = _OwnParameter(torch.empty(3))
        p.requires_grad_(False)
        module = nn.Module()
        module.weight = p  # register_parameter reads grad_fn
        p.detach()
        return p

    _OwnParameter.calls = []
    build()
    eager_calls = _OwnParameter.calls
    _OwnParameter.calls = []
    p = torchdefer.deferred_init(build)
    assert _OwnParameter.calls == eager_calls and {"grad_fn", "detach"} <= set(eager_calls)
    assert isinstance(p, _OwnParameter) and not p.requires_grad


def test_requires_grad_false_of_a_non_leaf_is_refused_after_many_parameters():
    def build():
        params = [nn.Parameter(torch.empty(2)) for _ in range(3)]
        y = params[0] * 2
        y.requires_grad_(False)

    with pytest.raises(RuntimeError) as eager:
        build()
    with pytest.raises(RuntimeError) as deferred:
        torchdefer.deferred_init(build)
    assert str(deferred.value) == str(eager.value)


@pytest.mark.parametrize("misuse", [
    lambda t: t.requires_grad_(foo=1),
    lambda t: t.requires_grad_(True, 2),
    lambda t: t.requires_grad_(1),
    lambda t: torch.Tensor.requires_grad_(t, foo=1),
    lambda t: t.detach(1),
    lambda t: t.detach(foo=1),
    lambda t: setattr(t, "grad_fn", None),
    lambda t: delattr(t, "grad_fn"),
], ids=["rg-keyword", "rg-two", "rg-int", "rg-unbound", "detach-arg", "detach-keyword",
        "grad_fn-set", "grad_fn-del"])
def test_the_per_parameter_shortcuts_refuse_a_wrong_call_in_torchs_words(misuse):
    # DeferredTensor's own detach, requires_grad_ and grad_fn hand any call but
    # the plain form to torch's, whose error eager raises.
    with pytest.raises(Exception) as eager:
        misuse(torch.empty(2))
    with pytest.raises(Exception) as deferred:
        torchdefer.deferred_init(lambda: misuse(torch.empty(2)))
    assert (type(deferred.value), str(deferred.value)) == (type(eager.value), str(eager.value))
