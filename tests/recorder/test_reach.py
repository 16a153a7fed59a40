"""The module walk (recorder/_reach.py): what it reaches, in which order, at what cost."""

from __future__ import annotations

import functools

import torch
from torch import nn

import torchdefer
from torchdefer.recorder._reach import GRAD, PARAMETER, reached_tensors


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.norm = nn.LayerNorm(3)
        self.register_buffer("steps", torch.zeros(()))
        self.register_parameter("absent", None)
        self.empty = None


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = _Block()
        self.layers = nn.ModuleList([_Block() for _ in range(3)])
        self.again = self.layers[1]  # one module under two names
        self.head = nn.Linear(3, 2)
        self.add_module("gone", None)


def _registered(module: nn.Module) -> list[tuple[str, str]]:
    """Parameters and buffers in ``named_modules`` order: what the walk must give."""
    out = []
    for prefix, sub in module.named_modules():
        for kind, table in ((PARAMETER, sub._parameters), ("buffer", sub._buffers)):
            out += [(f"{prefix}.{n}" if prefix else n, kind) for n, t in table.items()
                    if t is not None]
    return out


def test_parameters_and_buffers_are_reached_in_named_modules_order_each_module_once():
    torch.manual_seed(0)
    for model in (_Net(), torchdefer.deferred_init(_Net)):
        got = [(r.path, r.kind) for r in reached_tensors(model) if r.kind != "attribute"]
        assert got == _registered(model)


def test_a_deferred_parameters_grad_is_reached_as_the_object_it_holds():
    class Trained(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.lin(torch.ones(1, 2)).sum().backward()

    model = torchdefer.deferred_init(Trained)
    grads = [r for r in reached_tensors(model) if r.kind == GRAD]
    assert [r.path for r in grads] == ["lin.weight.grad", "lin.bias.grad"]
    assert grads[0].tensor is model.lin.weight.grad
    assert grads[0].parameter is model.lin.weight
    torchdefer.materialize_module(model)
    torch.manual_seed(0)
    assert model.lin.weight.grad is not None and not torchdefer.is_deferred(model.lin.weight.grad)


def test_a_tensor_in_a_non_empty_hook_dict_is_still_reached():
    model = torchdefer.deferred_init(nn.Linear, 2, 2)
    held = model.weight * 2
    model.register_forward_hook(functools.partial(lambda scale, *_: None, held))
    paths = [r.path for r in reached_tensors(model)]
    assert any(p.startswith("_forward_hooks[") and p.endswith(".args[0]") for p in paths)


def test_an_object_held_by_every_module_is_looked_into_once():
    asked: list[str] = []

    class Config:
        def __init__(self) -> None:
            self.table = torch.zeros(2)

        def __getattribute__(self, name: str):
            asked.append(name)
            return object.__getattribute__(self, name)

    class Layer(nn.Module):
        def __init__(self, config: Config) -> None:
            super().__init__()
            self.config = config

    config = Config()
    model = nn.Sequential(*(Layer(config) for _ in range(20)))
    asked.clear()
    found = [r.path for r in reached_tensors(model)]
    assert found == ["0.config.table"]
    assert len(asked) <= 3  # __dict__ once, not __class__ for every isinstance per module
