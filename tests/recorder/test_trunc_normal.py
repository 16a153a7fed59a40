"""trunc_normal_ with bounds normal_ cannot reach is recorded as its one normal_."""

import warnings

import pytest
import torch
from torch import nn

import torchdefer
from parity import check_module_parity, check_program, trunc_normal_reads_data
from torchdefer.recorder import NodeKind, _trunc_normal
from torchdefer.recorder._composite import _reads_data

# What is specific to the rejection loop (torch >= 2.12: before, trunc_normal_ is
# erfinv of a uniform, recorded op by op); parity with eager is checked on every torch.
needs_loop = pytest.mark.skipif(
    not trunc_normal_reads_data(), reason="before torch 2.12 trunc_normal_ is recorded op by op"
)


class Titan(nn.Module):
    """torchtitan 0.3 llama3's init scheme, small: default bounds, depth-scaled std,
    and a 3-sigma output layer."""

    def __init__(self, dim=64, hidden=160, vocab=100, layers=2, dtype=None):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim, dtype=dtype)
        self.layers = nn.ModuleList()
        shapes = (("wq", dim), ("wo", dim), ("w1", hidden), ("w3", hidden))
        for i in range(layers):
            block = nn.ModuleDict(
                {n: nn.Linear(dim, d, bias=False, dtype=dtype) for n, d in shapes}
            )
            block["w2"] = nn.Linear(hidden, dim, bias=False, dtype=dtype)
            depth_std = 0.02 / (2 * (i + 1)) ** 0.5
            nn.init.trunc_normal_(block["wq"].weight, mean=0.0, std=0.02)
            nn.init.trunc_normal_(block["w1"].weight, mean=0.0, std=0.02)
            for name in ("wo", "w2", "w3"):
                nn.init.trunc_normal_(block[name].weight, mean=0.0, std=depth_std)
            self.layers.append(block)
        nn.init.normal_(self.tok.weight)
        self.output = nn.Linear(dim, vocab, bias=False, dtype=dtype)
        cutoff = dim**-0.5
        nn.init.trunc_normal_(self.output.weight, std=cutoff, a=-3 * cutoff, b=3 * cutoff)


def _ops(module):
    return {name: p._value.node for name, p in module.named_parameters()}


@needs_loop
def test_default_bounds_are_recorded_as_one_normal_and_three_sigma_as_a_composite():
    m = torchdefer.deferred_init(Titan)
    nodes = _ops(m)
    for name, node in nodes.items():
        if name == "output.weight":
            assert node.kind == NodeKind.RANDOM and "trunc_normal" in node.name
        else:
            assert node.op is torch.ops.aten.normal_.default, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_titan_init_matches_eager_bit_for_bit(dtype):
    check_module_parity(Titan, dtype=dtype)


@pytest.mark.parametrize("order", ["forward", "reverse", "partial"])
def test_any_order_and_the_generator_match_eager(order):
    def program(defer):
        m = defer(Titan)
        return m, torch.randn(5)  # a draw after the model: its position must be eager's

    n = len(Titan().state_dict()) + 1
    orders = {"forward": list(range(n)), "reverse": list(range(n))[::-1], "partial": [n - 1, 3, 1]}
    check_program(program, order=orders[order])


def test_the_default_generator_ends_where_eager_leaves_it():
    torch.manual_seed(5)
    Titan()
    eager = torch.default_generator.get_state()
    torch.manual_seed(5)
    torchdefer.deferred_init(Titan)
    assert torch.equal(torch.default_generator.get_state(), eager)


def test_an_explicit_generator_is_drawn_from_and_left_where_eager_leaves_it():
    def program(defer):
        g = torch.Generator().manual_seed(11)

        def build():
            w = torch.empty(40, 8)
            nn.init.trunc_normal_(w, std=0.5, generator=g)
            return w, torch.randn(3, generator=g)

        return (*defer(build), g)

    check_program(program)


@needs_loop
@pytest.mark.parametrize(
    "init",
    [
        lambda w: nn.init.trunc_normal_(w.zero_()[0, :5], std=0.02),  # under 16: cached normals
        lambda w: nn.init.trunc_normal_(w.t(), std=0.02),  # non-contiguous
        lambda w: nn.init.trunc_normal_(w, mean=1.0, std=1.0, a=-2.0, b=2.0),  # reachable
        lambda w: nn.init.trunc_normal_(w, std=1.0, a=-0.5, b=0.5),  # the uniform branch
    ],
    ids=["small", "strided", "reachable", "narrow"],
)
def test_calls_not_proven_stay_composites_and_match_eager(init):
    def build():
        w = torch.empty(20, 8)
        init(w)
        return w, torch.randn(4)

    check_program(lambda defer: defer(build))
    w, _ = torchdefer.deferred_init(build)
    assert w._value.node.op is not torch.ops.aten.normal_.default


@needs_loop
def test_the_bounds_as_the_dtype_holds_them_decide():
    # 2 sigma of float16: its rounding of b must be taken, not b.
    def build():
        w = torch.empty(64, dtype=torch.float16)
        nn.init.trunc_normal_(w, std=1.0, a=-6.7, b=6.7)
        return w

    check_program(lambda defer: defer(build))


@needs_loop
def test_a_torch_whose_loop_is_not_one_normal_keeps_the_composite(monkeypatch):
    # If the installed function did not draw exactly one normal_ the proof is not used.
    monkeypatch.setattr(_trunc_normal, "_draws_one_normal", lambda fn: False)
    _trunc_normal._proven.cache_clear()

    def build():
        w = torch.empty(32, 8)
        nn.init.trunc_normal_(w, std=0.02)
        return w

    w = torchdefer.deferred_init(build)
    _trunc_normal._proven.cache_clear()
    assert "trunc_normal" in w._value.node.name


@needs_loop
def test_the_one_normal_check_names_device_and_dtype_of_its_tensors():
    original = torch.nn.init._no_grad_trunc_normal_
    _trunc_normal._draws_one_normal.cache_clear()
    _reads_data.cache_clear()
    try:
        torch.set_default_dtype(torch.float64)
        with torch.device("meta"):
            assert _reads_data(torch.nn.init, "_no_grad_trunc_normal_")
            assert _trunc_normal._draws_one_normal(original)
    finally:
        torch.set_default_dtype(torch.float32)
        _trunc_normal._draws_one_normal.cache_clear()
        _reads_data.cache_clear()


@needs_loop
@pytest.mark.parametrize("ambient", ["meta", "cuda", "float64"])
def test_a_first_recording_under_an_ambient_setting_probes_right(ambient):
    _trunc_normal._draws_one_normal.cache_clear()
    _trunc_normal._proven.cache_clear()
    _reads_data.cache_clear()

    def build():
        w = torch.empty(48, 4, device="cpu", dtype=torch.float32)
        nn.init.trunc_normal_(w, std=0.02)
        return w

    try:
        if ambient == "float64":
            torch.set_default_dtype(torch.float64)
            w = torchdefer.deferred_init(build)
        else:
            with torch.device(ambient):
                w = torchdefer.deferred_init(build)
    finally:
        torch.set_default_dtype(torch.float32)
    assert w._value.node.op is torch.ops.aten.normal_.default
    assert _reads_data(torch.nn.init, "_no_grad_trunc_normal_")
    assert _trunc_normal._draws_one_normal(torch.nn.init._no_grad_trunc_normal_)


def test_meta_tensors_are_left_alone_as_eager_does():
    def build():
        w = torch.empty(32, 8, device="meta")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return nn.init.trunc_normal_(w, std=0.02)

    assert torchdefer.deferred_init(build).is_meta


@needs_loop
def test_data_dependent_calls_are_stepped_in_chunks_not_run_at_deferral(monkeypatch):
    from torchdefer.recorder._composite import Composite

    def build():
        w = torch.empty(300, 7)
        nn.init.trunc_normal_(w, std=0.5, a=-1.5, b=1.5)  # three sigma: rejects
        return w, torch.randn(4)

    torch.manual_seed(0)
    eager = build()
    eager_state = torch.get_rng_state()

    def refuse(self, *args, **kwargs):
        raise AssertionError("the composite ran whole at deferral")

    with monkeypatch.context() as m:
        m.setattr(Composite, "__call__", refuse)
        torch.manual_seed(0)
        got = torchdefer.deferred_init(build)
        assert torch.equal(torch.get_rng_state(), eager_state)
    assert "trunc_normal" in got[0]._value.node.name
    for g, e in zip(got, eager, strict=True):
        assert torch.equal(torchdefer.materialize_tensor(g), e)


@needs_loop
def test_leaving_deferral_after_a_large_three_sigma_call_holds_no_tensor_of_its_size():
    import psutil

    process = psutil.Process()
    torch.manual_seed(0)
    before = process.memory_info().rss
    with torchdefer.deferred():
        w = nn.Parameter(torch.empty(4096, 4096))  # 64 MiB if it were real
        std = 4096**-0.5
        nn.init.trunc_normal_(w, std=std, a=-3 * std, b=3 * std)
    assert process.memory_info().rss - before < 32 << 20
    assert torchdefer.is_deferred(w)


@needs_loop
@pytest.mark.parametrize("shape", [(1,), (5, 7), (300, 7)], ids=["one", "under-16", "large"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_narrow_uniform_branch_is_stepped_not_run_at_deferral(monkeypatch, shape, dtype):
    from torchdefer.recorder._composite import Composite

    def build():
        w = torch.empty(shape, dtype=dtype)
        nn.init.trunc_normal_(w, std=1.0, a=-0.25, b=0.3)  # p <= 0.3: the uniform loop
        return w, torch.randn(4)

    def refuse(self, *args, **kwargs):
        raise AssertionError("the composite ran whole at deferral")

    with monkeypatch.context() as m:
        m.setattr(Composite, "__call__", refuse)
        torch.manual_seed(0)
        got = torchdefer.deferred_init(build)
        state = torch.get_rng_state()
    torch.manual_seed(0)
    eager = build()
    assert torch.equal(torch.get_rng_state(), state)
    for g, e in zip(got, eager, strict=True):
        assert torch.equal(torchdefer.materialize_tensor(g), e)


@needs_loop
def test_a_proven_call_overwritten_whole_is_never_drawn(monkeypatch):
    import torchdefer.materialize._rng_replay as replay_rng

    def build():
        w = torch.empty(64, 32)
        nn.init.trunc_normal_(w, std=0.02)
        w.copy_(torch.full((64, 32), 0.5))  # as a checkpoint load would
        return w

    drawn = []
    original = replay_rng.draw
    monkeypatch.setattr(
        replay_rng, "draw", lambda node, *a: drawn.append(node.name) or original(node, *a)
    )
    w = torchdefer.deferred_init(build)
    assert torch.equal(torchdefer.materialize_tensor(w), torch.full((64, 32), 0.5))
    assert not drawn, drawn
