"""The module side of a load: each tensor object of a module and every name it has."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["TensorGroup", "named_modules", "tensor_groups"]


@dataclass(slots=True)
class TensorGroup:
    """One tensor object of a module and every name it is reachable by (ties)."""

    tensor: torch.Tensor
    names: list[str] = field(default_factory=list)  # state-dict names, in module order
    # Names as a non-persistent buffer: not in the state dict, never loaded.
    hidden: list[str] = field(default_factory=list)

    @property
    def persistent(self) -> bool:
        return bool(self.names)

    @property
    def path(self) -> str:
        """The first name, for messages."""
        return (self.names or self.hidden)[0]


def tensor_groups(module: nn.Module) -> list[TensorGroup]:
    """Every parameter and buffer object of ``module``, with all its names (tied ones share).

    A buffer registered with ``persistent=False`` is named in ``hidden``: like
    ``Module.state_dict``, loading never fills it.
    """
    groups: dict[int, TensorGroup] = {}
    for prefix, sub in named_modules(module):
        for kind in ("_parameters", "_buffers"):
            for attr, t in getattr(sub, kind).items():
                if t is None:
                    continue
                name = f"{prefix}.{attr}" if prefix else attr
                group = groups.get(id(t))
                if group is None:
                    group = groups[id(t)] = TensorGroup(t)
                if kind == "_buffers" and attr in sub._non_persistent_buffers_set:
                    group.hidden.append(name)
                else:
                    group.names.append(name)
    return list(groups.values())


def named_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """``module.named_modules(remove_duplicate=False)``, in its order: a module held
    under two names comes twice. An explicit stack: the nested generators of
    ``named_modules`` cost a frame per level for every module of a large model."""
    out = []
    stack = [("", module)]
    while stack:
        prefix, sub = stack.pop()
        out.append((prefix, sub))
        stack.extend(reversed([(f"{prefix}.{name}" if prefix else name, child)
                               for name, child in sub._modules.items() if child is not None]))
    return out
