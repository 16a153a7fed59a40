"""Small models whose recordings exercise every node kind, views and repeats."""

from __future__ import annotations

import torch
from torch import nn

# A real tensor from outside deferred_init: recorded as an EXTERNAL node.
OFFSET = torch.arange(4, dtype=torch.float32)


class Zoo(nn.Module):
    """One of every kind of recorded node."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        bias = self.lin.bias.data  # .data get
        bias.fill_(0.5)  # in place through the .data view
        self.lin.weight.data = torch.eye(4)  # .data set
        self.register_buffer("table", torch.tensor([1.0, 2.0, 3.0, 4.0]) + OFFSET)
        n = int(torch.arange(3).sum().item())  # a data-dependent read
        self.register_buffer("steps", torch.full((n,), 2.0))


class ViewsMutatedAfterTaken(nn.Module):
    """``row`` and ``col`` view one storage; a write through ``row`` changes ``col``."""

    def __init__(self) -> None:
        super().__init__()
        base = torch.zeros(4, 4)
        self.register_buffer("col", base[:, 2])
        self.register_buffer("row", base[1])
        self.row.add_(1.0)
        base.mul_(3.0)


class Expert(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)


class Block(nn.Module):
    def __init__(self, width: int, experts: int = 3) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, width)
        self.experts = nn.ModuleList(Expert(width) for _ in range(experts))


class Stack(nn.Module):
    """Layers of the given widths: equal widths are identical, repeated layers."""

    def __init__(self, widths: tuple[int, ...] = (4, 4, 4, 4, 4)) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, widths[0])
        self.layers = nn.ModuleList(Block(w) for w in widths)
        self.head = nn.Linear(widths[-1], 10, bias=False)
        self.head.weight = self.embed.weight  # tied
