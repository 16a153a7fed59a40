"""The tensors a module reaches: parameters, buffers, and tensors kept as plain attributes.

Models keep tensors outside ``_parameters`` and ``_buffers`` too: a rotary
table as ``self.inv_freq = ...``, legacy ``weight_norm``'s recomputed
``weight``, caches in lists and dicts. Those are as much part of the built
model as its buffers, so :func:`is_deferred` and ``materialize_module`` see
them through :func:`reached_tensors`: a module's ``__dict__`` values, looked
into through lists, tuples, dicts and sets (and unregistered modules kept in
them), each object once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Reached", "reached_tensors"]

PARAMETER = "parameter"
BUFFER = "buffer"
ATTRIBUTE = "attribute"
GRAD = "grad"  # a parameter's .grad (a backward pass run during construction)

# Module internals that hold no model tensors (hooks, registries).
_SKIPPED = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})
_CONTAINERS = (list, tuple, dict, set, frozenset)
_MAX_DEPTH = 6  # containers nest that deep at most before we stop looking


@dataclass(frozen=True, slots=True)
class Reached:
    """One tensor reachable from a module, and where."""

    path: str  # "layers.3.attn.inv_freq", "cache[2]", "tables['cos']"
    module: nn.Module  # the module whose attribute holds it
    kind: str  # "parameter", "buffer", "attribute" or "grad"
    tensor: torch.Tensor
    parameter: torch.Tensor | None = None  # for a grad: the parameter it belongs to


def reached_tensors(
    module: nn.Module, check_fn: Callable[[nn.Module], bool] | None = None
) -> Iterator[Reached]:
    """Every (path, tensor) ``module`` reaches; tied tensors once per place they are held.

    Args:
        module: the root module.
        check_fn: if given, only modules for which it returns True contribute
            their own tensors (their descendants are still visited).
    """
    seen_modules: set[int] = set()
    pending: list[tuple[str, nn.Module]] = [("", module)]
    while pending:
        root_prefix, root = pending.pop()
        for prefix, sub in root.named_modules(prefix=root_prefix):
            if id(sub) in seen_modules:
                continue
            seen_modules.add(id(sub))
            if check_fn is not None and not check_fn(sub):
                continue
            for name, t in sub._parameters.items():
                if t is not None:
                    yield Reached(_join(prefix, name), sub, PARAMETER, t)
                    if t.grad is not None:
                        yield Reached(_join(prefix, name) + ".grad", sub, GRAD, t.grad, t)
            for name, t in sub._buffers.items():
                if t is not None:
                    yield Reached(_join(prefix, name), sub, BUFFER, t)
            for name, value in sub.__dict__.items():
                if name in _SKIPPED:
                    continue
                for path, found in _look_into(_join(prefix, name), value, 0, set()):
                    if isinstance(found, nn.Module):
                        pending.append((path, found))  # kept unregistered, in a container
                    else:
                        yield Reached(path, sub, ATTRIBUTE, found)


def _look_into(path: str, value: object, depth: int, seen: set[int]):
    if isinstance(value, torch.Tensor):
        yield path, value
        return
    if depth > 0 and isinstance(value, nn.Module):
        yield path, value
        return
    if not isinstance(value, _CONTAINERS) or depth >= _MAX_DEPTH or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, dict):
        items = ((f"{path}[{k!r}]", v) for k, v in value.items())
    else:
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    for item_path, item in items:
        yield from _look_into(item_path, item, depth + 1, seen)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
