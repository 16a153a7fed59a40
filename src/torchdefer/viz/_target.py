"""What a picture or an explanation is about: named tensors, deferred or real."""

from __future__ import annotations

import gc
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from torchdefer.errors import UsageTypeError
from torchdefer.recorder._tensor import DeferredTensor
from torchdefer.viz._format import fmt_dtype, fmt_shape

__all__ = ["Target", "module_paths", "owner_names", "targets_of"]


@dataclass(frozen=True, slots=True)
class Target:
    """One tensor to show, with every name it has (tied weights have several)."""

    tensor: torch.Tensor
    names: tuple[str, ...]
    # The module path its ops are clustered under: the common prefix of the
    # modules owning it ("" for a tensor outside any module).
    module: str

    @property
    def deferred(self) -> bool:
        return isinstance(self.tensor, DeferredTensor)

    @property
    def name(self) -> str:
        return self.names[0]


def targets_of(obj: object) -> tuple[list[Target], dict[str, str]]:
    """The targets of ``obj`` and the module tree (path -> class name).

    Args:
        obj: a tensor, an iterable of tensors, or a module (all its
            parameters and buffers, under every name they have).

    Returns:
        ``(targets, modules)``; ``modules`` is empty unless ``obj`` is a module.
    """
    if isinstance(obj, nn.Module):
        return _module_targets(obj)
    if isinstance(obj, torch.Tensor):
        return [Target(obj, ("tensor",), "")], {}
    if isinstance(obj, Iterable) and not isinstance(obj, (str, bytes)):
        items = list(obj)
        bad = [type(x).__name__ for x in items if not isinstance(x, torch.Tensor)]
        if not bad:
            return [Target(t, (f"tensor[{i}]",), "") for i, t in enumerate(items)], {}
        got = f"a sequence holding {bad[0]}"
    else:
        got = type(obj).__name__
    raise UsageTypeError(
        f"torchdefer.viz expects a deferred tensor, a list of them, or an nn.Module; got "
        f"{got}. Pass the model built by torchdefer.deferred_init or its tensors."
    )


def _module_targets(root: nn.Module) -> tuple[list[Target], dict[str, str]]:
    modules = {path: type(m).__name__ for path, m in root.named_modules(remove_duplicate=False)}
    named: dict[int, tuple[torch.Tensor, list[str]]] = {}
    tensors: list[tuple[str, torch.Tensor]] = list(root.named_parameters(remove_duplicate=False))
    tensors += list(root.named_buffers(remove_duplicate=False))
    for name, t in tensors:
        named.setdefault(id(t), (t, []))[1].append(name)
    targets = [
        Target(t, tuple(names), common_module(names)) for t, names in named.values()
    ]
    return targets, modules


def common_module(names: Iterable[str]) -> str:
    """The longest module path that owns every name (``a.b.weight`` -> ``a.b``)."""
    return common_prefix(n.rpartition(".")[0] for n in names)


def common_prefix(paths: Iterable[str]) -> str:
    """The longest common dotted prefix, component-wise."""
    common: list[str] | None = None
    for path in paths:
        parts = path.split(".") if path else []
        if common is None:
            common = parts
            continue
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        del common[n:]
    return ".".join(common or [])


def module_paths(root: nn.Module, tensor: torch.Tensor) -> list[str]:
    """Every name under which ``root`` holds ``tensor`` as a parameter or buffer."""
    found = [n for n, t in root.named_parameters(remove_duplicate=False) if t is tensor]
    found += [n for n, t in root.named_buffers(remove_duplicate=False) if t is tensor]
    return found


def owner_names(tensor: torch.Tensor) -> list[str]:
    """Names of ``tensor`` in the live modules that hold it, from their topmost parent.

    Tensors do not know their module, so this looks at the modules alive in
    the process (``gc``): slow on huge heaps, meant for interactive use.
    Pass the model explicitly (``explain(t, model)``) to avoid it.
    """
    # type() rather than isinstance: isinstance reads __class__, which some
    # lazily deprecated objects (torch.distributed.reduce_op) answer with a warning.
    modules = [o for o in gc.get_objects() if issubclass(type(o), nn.Module)]
    parent: dict[int, tuple[nn.Module, str]] = {}
    for m in modules:
        for name, child in m._modules.items():
            if child is not None:
                parent.setdefault(id(child), (m, name))
    names = []
    for m in modules:
        for kind in (m._parameters, m._buffers):
            for name, t in kind.items():
                if t is tensor:
                    names.append([*_path_up(m, parent), name])
    return sorted({".".join(parts) for parts in names}, key=lambda s: (len(s), s))


def _path_up(module: nn.Module, parent: dict[int, tuple[nn.Module, str]]) -> list[str]:
    parts: list[str] = []
    seen = {id(module)}
    while id(module) in parent:
        module, name = parent[id(module)]
        if id(module) in seen:  # a module cycle: stop rather than loop
            break
        seen.add(id(module))
        parts.append(name)
    return parts[::-1]


def describe_real(tensor: torch.Tensor) -> str:
    """``4x4 float32 on cpu`` (with a multiplication sign)."""
    return f"{fmt_shape(tuple(tensor.shape))} {fmt_dtype(tensor.dtype)} on {tensor.device}"
