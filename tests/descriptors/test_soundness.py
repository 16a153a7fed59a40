"""No silent wrong result: sizes and values export did not cover get their own graph."""

import pytest
import torch

import torchdefer
from torchdefer.descriptors import MetaTensorType

F32 = torch.float32


class SingletonBranch(torch.nn.Module):
    """Branches on a length being 1: export traces at b >= 2 and assumes it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return x * 100
        return x.sum(0, keepdim=True).expand_as(x) - x


class IntBranch(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        if n == 1:
            return x - 1000
        return x * n


class Loop(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        for _ in range(n):
            x = x * 2 + 1
        return x


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_code_branching_on_a_length_of_one_is_right_for_every_length(backend):
    model = SingletonBranch()
    p = torchdefer.script(model, {"x": MetaTensorType(["b", 3], F32)}, backend=backend)
    for b in [2, 1, 0, 5, 1]:
        x = torch.randn(b, 3)
        torch.testing.assert_close(p(x), model(x))


def test_export_builds_a_graph_for_each_uncovered_size_once():
    p = torchdefer.script(SingletonBranch(), {"x": MetaTensorType(["b", 3], F32)})
    assert p.variants == 1
    for b in [1, 1, 0, 7, 1, 0]:
        p(torch.randn(b, 3))
    assert p.variants == 3  # b >= 2, b == 1, b == 0


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_int_argument_equal_to_one_takes_the_branch_eager_takes(backend):
    model = IntBranch()
    p = torchdefer.script(model, {"x": MetaTensorType(["b"], F32), "n": int}, backend=backend)
    x = torch.randn(4)
    for n in [3, 1, 0, -2, 1, 7]:
        torch.testing.assert_close(p(x, n), model(x, n))


@pytest.mark.parametrize("backend", ["export", "jit"])
def test_loop_over_an_int_argument_is_right_for_every_count(backend):
    model = Loop()
    p = torchdefer.script(model, {"x": MetaTensorType(["b"], F32), "n": int}, backend=backend)
    x = torch.randn(3)
    for n in [2, 3, 0, 5, 3]:
        torch.testing.assert_close(p(x, n), model(x, n))


def test_range_that_lies_below_two_is_served_by_fixed_graphs():
    model = SingletonBranch()
    p = torchdefer.script(model, {"x": MetaTensorType(["b", 3], F32, dim_ranges={"b": (0, 1)})})
    for b in [0, 1, 1, 0]:
        x = torch.randn(b, 3)
        torch.testing.assert_close(p(x), model(x))


def test_loaded_program_refuses_a_size_it_has_no_graph_for(tmp_path):
    p = torchdefer.script(SingletonBranch(), {"x": MetaTensorType(["b", 3], F32)})
    torchdefer.save_program(p, tmp_path / "p.tdp")
    q = torchdefer.load_program(tmp_path / "p.tdp")
    torch.testing.assert_close(q(torch.ones(4, 3)), SingletonBranch()(torch.ones(4, 3)))
    with pytest.raises(RuntimeError, match=r"has no graph for this call \(b=1; inputs cpu, torch.strided\).*call the scripted program with such inputs once before save_program\(\)"):
        q(torch.ones(1, 3))


def test_graphs_built_before_save_are_loaded_and_used(tmp_path):
    model = IntBranch()
    p = torchdefer.script(model, {"x": MetaTensorType(["b"], F32), "n": int})
    x = torch.randn(5)
    p(x, 1)
    p(torch.randn(1), 4)
    torchdefer.save_program(p, tmp_path / "p.tdp")
    q = torchdefer.load_program(tmp_path / "p.tdp")
    assert q.variants == p.variants == 3
    torch.testing.assert_close(q(x, 1), model(x, 1))
    torch.testing.assert_close(q(x, 6), model(x, 6))
    torch.testing.assert_close(q(torch.ones(1), 4), model(torch.ones(1), 4))
