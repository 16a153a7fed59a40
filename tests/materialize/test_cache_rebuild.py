"""Tensors rebuilt from a cached storage have eager's layout and values, in any order.

Materializing one view of a storage caches the real storage; other views of it
are rebuilt over it. The rebuilt tensor must have eager's sizes, strides,
offset, lazy conjugate/negative bits and values, also when the metadata of a
tensor changed in place (``t_()``, ``as_strided_``, ``set_``) and when a kernel
lays out its output otherwise than its meta kernel said.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchdefer
from parity import assert_same_tensor, build_both


def assert_same_layout(real, ref, name=""):
    assert_same_tensor(real, ref, name)
    assert real.storage_offset() == ref.storage_offset(), f"{name}: offset"
    assert real.is_conj() == ref.is_conj() and real.is_neg() == ref.is_neg(), f"{name}: bits"


def conj_views():
    z = torch.randn(3, 4, dtype=torch.cfloat)
    return z, z.conj(), z.conj().imag, z.conj()[1:].t(), torch.view_as_real(z.conj().resolve_conj())


def neg_view():
    x = torch.randn(5)
    return x, torch._neg_view(x)[1:]


def metadata_changed_in_place():
    w = torch.randn(3, 4)
    row = w[1]
    w.t_()
    flat = torch.arange(12.0)
    head = flat[2:]
    flat.as_strided_((3, 2), (1, 3), 1)
    flat.mul_(2)
    return w, row, flat, head


def set_onto_a_view():
    x, y = torch.zeros(3), torch.randn(4, 4)
    x.set_(y[1:, 2])
    y.add_(1)
    return x, y, y.t()


def svd_and_eig_factors():
    u, s, vh = torch.linalg.svd(torch.randn(4, 4))
    _, vectors = torch.linalg.eig(torch.randn(3, 3))
    return vh, vh[:2], vh.t(), vectors, vectors[1:]


def channels_last_convolution():
    x = torch.randn(1, 2, 5, 5).to(memory_format=torch.channels_last)
    y = F.conv2d(x, torch.randn(3, 2, 3, 3))
    return y, y[0, 1], y.permute(0, 2, 3, 1)


def version_bumped_between_views():
    w = torch.randn(4, 4)
    a = w.t()
    w.add_(1)
    b = w[1:]
    b.mul_(3)
    return a, b, w


PROGRAMS = [
    conj_views, neg_view, metadata_changed_in_place, set_onto_a_view,
    svd_and_eig_factors, channels_last_convolution, version_bumped_between_views,
]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_rebuilt_views_have_eager_layout_and_values_in_every_order(program):
    n = len(program())
    for order in itertools.permutations(range(n)):
        eager, deferred = build_both(program)
        reals = {i: torchdefer.materialize_tensor(deferred[i]) for i in order}
        for i in range(n):
            assert_same_layout(reals[i], eager[i], f"{program.__name__}[{i}] order {order}")


def test_views_of_a_cuda_recorded_factor_materialized_on_cpu_match_cpu_eager():
    def build(device):
        _, _, vh = torch.linalg.svd(torch.randn(4, 4, device=device))
        return vh, vh[1:], vh.t()

    torch.manual_seed(0)
    eager = build("cpu")
    for order in itertools.permutations(range(3)):
        torch.manual_seed(0)
        deferred = torchdefer.deferred_init(build, "cuda")
        reals = {i: torchdefer.materialize_tensor(deferred[i], device="cpu") for i in order}
        for i in range(3):
            assert_same_layout(reals[i], eager[i], f"[{i}] order {order}")


VIEWS = {
    "t": lambda x: x.t() if x.dim() == 2 else x,
    "slice": lambda x: x[1:],
    "step": lambda x: x[::2],
    "diagonal": lambda x: x.diagonal() if x.dim() == 2 else x,
    "unsqueeze": lambda x: x.unsqueeze(0),
    "expand": lambda x: x.unsqueeze(0).expand(2, *x.shape),
    "conj": lambda x: x.conj(),
    "imag": lambda x: x.conj().imag if x.is_complex() else x,
    "as_strided": lambda x: x.as_strided((2,), (2,), 1) if x.numel() >= 4 else x,
    "view_dtype": lambda x: (
        x.view(torch.int32) if x.dtype == torch.float32 and x.dim() and not x.is_neg() else x
    ),
}
ROOTS = {
    "randn": lambda: torch.randn(4, 4),
    "complex": lambda: torch.randn(4, 4, dtype=torch.cfloat),
    "svd_vh": lambda: torch.linalg.svd(torch.randn(4, 4))[2],
    "conv_channels_last": lambda: F.conv2d(
        torch.randn(1, 1, 6, 6).to(memory_format=torch.channels_last), torch.randn(1, 1, 3, 3)
    )[0, 0],
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    root=st.sampled_from(sorted(ROOTS)),
    chains=st.lists(st.lists(st.sampled_from(sorted(VIEWS)), max_size=3), min_size=1, max_size=4),
    write=st.booleans(),
    order=st.randoms(use_true_random=False),
)
def test_chains_of_views_rebuild_like_eager_in_any_order(root, chains, write, order):
    def build():
        base = ROOTS[root]()
        out = [base]
        for chain in chains:
            t = base
            for name in chain:
                t = VIEWS[name](t)
            out.append(t)
        if write:
            base.mul_(2)
        return out

    eager, deferred = build_both(build)
    indices = list(range(len(eager)))
    order.shuffle(indices)
    reals = {i: torchdefer.materialize_tensor(deferred[i]) for i in indices}
    for i in range(len(eager)):
        assert_same_layout(reals[i], eager[i], f"tensor {i}")


# --- tensors computed at construction, materialized after a training step (class 7) ---

def _step_in_place(m):
    with torch.no_grad():
        m.weight.add_(1)


def _step_through_data(m):  # no version bump: .data has a version counter of its own
    m.weight.data.mul_(-3)


def _step_by_optimizer(m):
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m(torch.ones(2, 3)).sum().backward()
    opt.step()


def _step_through_a_set_alias(m):  # another tensor over the same storage
    with torch.no_grad():
        torch.empty(0).set_(m.weight.untyped_storage(), 0, (9,), (1,)).fill_(4.0)


STEPS = {"in_place": _step_in_place, "data": _step_through_data,
         "optimizer": _step_by_optimizer, "set_alias": _step_through_a_set_alias}


def _computed_and_aliases():
    m = torch.nn.Linear(3, 3)
    return m, {
        "double": m.weight * 2,  # computed: construction-time contents
        "sum_t": m.weight.t().sum(0),  # computed through a view
        "grown": torch.cat([m.weight.flatten(), m.bias]),
        "row": m.weight[0],  # views: the user's tensor as it is now, as in eager
        "set_onto": torch.empty(0).set_(m.weight),
        "data": m.weight.data,
    }


@pytest.mark.parametrize("first", ["module", "row"])
@pytest.mark.parametrize("step", list(STEPS))
def test_a_tensor_computed_at_construction_keeps_its_value_after_a_training_step(step, first):
    (m_eager, eager), (m_lazy, lazy) = build_both(_computed_and_aliases)
    if first == "row":  # a view materialized before the parameter itself
        torchdefer.materialize_tensor(lazy["row"])
    torchdefer.materialize_module(m_lazy)
    for m in (m_eager, m_lazy):
        STEPS[step](m)
    assert torch.equal(m_lazy.weight, m_eager.weight)
    for name in eager:
        real = torchdefer.materialize_tensor(lazy[name])
        assert_same_tensor(real, eager[name], name)
        aliases = real.untyped_storage().data_ptr() == m_lazy.weight.untyped_storage().data_ptr()
        assert aliases == (name in ("row", "set_onto", "data")), name


def test_a_write_through_a_materialized_view_is_not_read_by_a_later_computation():
    def build():
        w = torch.randn(4, 4)
        return w, w[1], w @ w.t(), (w * 3).t()

    eager, lazy = build_both(build)
    row = torchdefer.materialize_tensor(lazy[1])
    row.fill_(7.0)
    eager[1].fill_(7.0)
    for i in (2, 3, 0):
        assert_same_tensor(torchdefer.materialize_tensor(lazy[i]), eager[i], f"output {i}")


def test_within_one_materialize_module_call_a_buffer_reads_the_parameter_from_the_cache():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(64, 64))
            self.register_buffer("scaled", self.weight.detach() * 0.5)

    torch.manual_seed(0)
    eager = M()
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(M)
    graph = torchdefer.recorder._tensor.graph_of((lazy.weight,), {})
    assert graph not in torchdefer.materialize._cache._caches  # nothing materialized yet
    replayed = []
    from torchdefer.materialize import _replay as replay_module

    run_node = replay_module.Replay._run_node

    def counting(self, node, *rest):
        replayed.append(node.name)
        return run_node(self, node, *rest)

    replay_module.Replay._run_node = counting
    try:
        torchdefer.materialize_module(lazy)
    finally:
        replay_module.Replay._run_node = run_node
    assert torch.equal(lazy.scaled, eager.scaled) and torch.equal(lazy.weight, eager.weight)
    assert replayed.count("aten.randn.default") == 1, replayed  # the init ran once


def test_a_skipped_random_op_draws_as_many_numbers_as_construction_after_its_input_changed():
    # poisson's draws depend on its rates: skipped (its output not wanted), it
    # runs into scratch memory to move the generator, from the rates
    # construction gave, not from the changed buffer.
    class Rates(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("rate", torch.full((50,), 3.0))

    def build():
        m = Rates()
        return m, torch.poisson(m.rate), torch.randn(5)

    (m_eager, *eager), (m_lazy, *lazy) = build_both(build)
    torchdefer.materialize_module(m_lazy)
    for m in (m_eager, m_lazy):
        m.rate.mul_(10)
    for i in (1, 0):
        assert_same_tensor(torchdefer.materialize_tensor(lazy[i]), eager[i], f"output {i}")


def test_a_view_rebuilt_through_its_base_aliases_the_trained_parameter():
    # zeros_like of a flipped diagonal: replay gives eager's strides, the meta
    # kernel others, so the views are rebuilt through the base they alias,
    # which is the user's tensor (changed by the step), not construction's.
    def build():
        w = torch.nn.Parameter(torch.zeros_like(torch.randn(5, 7)[None].diagonal().flip(0)))
        return w, w.data, torch.empty(0).set_(w), w.detach().t()

    eager, lazy = build_both(build)
    weight = torchdefer.materialize_tensor(lazy[0])
    for w in (eager[0], weight):
        with torch.no_grad():
            w.add_(3)
    for i in (1, 2, 3):
        real = torchdefer.materialize_tensor(lazy[i])
        assert_same_tensor(real, eager[i], f"output {i}")
        assert real.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
