"""Ops returning several views (``chunk``, ``split``, ``unbind`` ...) alias their base.

``for p in w.chunk(3): nn.init.xavier_uniform_(p)`` must initialize ``w``, as in
eager code, whatever order the tensors are materialized in.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import torchdefer
from parity import assert_same_tensor, build_both

SPLITTERS = {
    "chunk": lambda w: w.chunk(3),
    "chunk_dim1": lambda w: w.chunk(2, dim=1),
    "split": lambda w: w.split(2),
    "split_sizes": lambda w: w.split([1, 2, 3]),
    "split_with_sizes": lambda w: torch.split_with_sizes(w, [4, 2]),
    "unbind": lambda w: w.unbind(0),
    "unbind_dim1": lambda w: torch.unbind(w, 1),
    "tensor_split_sections": lambda w: torch.tensor_split(w, 4),
    "tensor_split_indices": lambda w: w.tensor_split([1, 4], dim=0),
    "hsplit": lambda w: torch.hsplit(w, 2),
    "vsplit": lambda w: torch.vsplit(w, [2]),
    "dsplit": lambda w: torch.dsplit(w.view(6, 2, 2), 2),
    "unsafe_split": lambda w: torch.unsafe_split(w, 3),
    "unsafe_chunk": lambda w: torch.unsafe_chunk(w, 2),
    "unsafe_split_with_sizes": lambda w: torch.unsafe_split_with_sizes(w, [5, 1]),
    "unflatten": lambda w: [w.unflatten(0, (2, 3))],
    "views_of_views": lambda w: [p.t() for p in w.split(3)],
}


@pytest.mark.parametrize("name", sorted(SPLITTERS))
@pytest.mark.parametrize("order", ["base_first", "parts_first"])
def test_writes_through_every_part_reach_the_base(name, order):
    def build():
        w = torch.zeros(6, 4)
        parts = list(SPLITTERS[name](w))
        with torch.no_grad():
            for i, p in enumerate(parts):
                if p.dim() >= 2:
                    nn.init.xavier_uniform_(p)
                else:
                    p.add_(i + 1).mul_(torch.randn(()))
        return [w, *parts]

    eager, deferred = build_both(build)
    pairs = list(zip(eager, deferred, strict=True))
    if order == "parts_first":
        pairs = pairs[1:] + pairs[:1]
    for ref, t in pairs:
        assert_same_tensor(torchdefer.materialize_tensor(t), ref)


def test_a_qkv_weight_initialized_per_chunk_matches_eager():
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 24)
            with torch.no_grad():
                for p in self.qkv.weight.chunk(3):
                    nn.init.xavier_uniform_(p)
                for b in self.qkv.bias.split(8):
                    b.fill_(torch.randn(()).item())

    eager, deferred = build_both(Attention)
    torchdefer.materialize_module(deferred)
    assert_same_tensor(deferred.qkv.weight, eager.qkv.weight)
    assert_same_tensor(deferred.qkv.bias, eager.qkv.bias)


def test_outputs_viewing_different_inputs_each_follow_their_own_base():
    def build():
        a, b = torch.zeros(3), torch.zeros(2)
        grid = torch.meshgrid(a, b, indexing="ij")
        a.normal_()
        b.add_(5)
        return [*grid, a, b]

    eager, deferred = build_both(build)
    for ref, t in zip(eager, deferred, strict=True):
        assert_same_tensor(torchdefer.materialize_tensor(t), ref)


def test_parts_share_storage_with_their_base_after_materialization():
    def build():
        w = torch.randn(4, 4)
        return [w, *w.unbind(0)]

    _, deferred = build_both(build)
    reals = [torchdefer.materialize_tensor(t) for t in reversed(deferred)]
    pointers = {r.untyped_storage().data_ptr() for r in reals}
    assert len(pointers) == 1


step = st.tuples(
    st.sampled_from(sorted(SPLITTERS)),
    st.integers(0, 20),  # which part to write
    st.sampled_from(["normal_", "add_", "copy_", "zero_"]),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=6), order=st.randoms(use_true_random=False))
def test_random_writes_through_parts_match_eager_in_any_order(steps, order):
    def build():
        w = torch.randn(6, 4)
        pool = [w]
        for name, k, op in steps:
            parts = list(SPLITTERS[name](w))
            p = parts[k % len(parts)]
            pool.append(p)
            {
                "normal_": lambda: p.normal_(),
                "add_": lambda: p.add_(k),
                "copy_": lambda: p.copy_(torch.randn(p.shape)),
                "zero_": lambda: p.zero_(),
            }[op]()
        return pool

    eager, deferred = build_both(build)
    indices = list(range(len(eager)))
    order.shuffle(indices)
    for i in indices:
        assert_same_tensor(torchdefer.materialize_tensor(deferred[i]), eager[i], f"tensor {i}")
