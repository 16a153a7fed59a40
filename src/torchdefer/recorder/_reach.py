"""The tensors a module reaches: parameters, buffers, and tensors kept as plain attributes.

Models keep tensors outside ``_parameters`` and ``_buffers`` too: a rotary
table as ``self.inv_freq = ...``, legacy ``weight_norm``'s recomputed
``weight``, caches in lists and dicts. Those are as much part of the built
model as its buffers, so :func:`is_deferred` and ``materialize_module`` see
them through :func:`reached_tensors`: a module's ``__dict__`` values, looked
into through lists, tuples, dicts and sets, the attributes (``__dict__`` and
``__slots__``) of plain objects (a rotary cache class that is no module, a
dataclass, a ``SimpleNamespace``), the arguments of a ``functools.partial``,
and unregistered modules kept in any of them, each object once. Objects of
the standard library (a logger, a lock) and functions, classes and Python
modules are not looked into.
"""

from __future__ import annotations

import collections
import functools
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchdefer import _compat
from torchdefer.recorder._tensor import DeferredTensor, holds_deferred

__all__ = ["Reached", "is_deferred", "reached_tensors"]

PARAMETER = "parameter"
BUFFER = "buffer"
ATTRIBUTE = "attribute"
GRAD = "grad"  # a parameter's .grad (a backward pass run during construction)

# Module internals that hold no model tensors (hooks, registries).
_SKIPPED = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})
_CONTAINERS = (list, tuple, dict, set, frozenset)
_MAX_DEPTH = 6  # containers nest that deep at most before we stop looking
_NOT_LOOKED_INTO = (type, types.ModuleType, types.FunctionType, types.MethodType,
                    types.BuiltinFunctionType, functools.partialmethod)
_STDLIB = frozenset(sys.stdlib_module_names) - {"types", "functools"}
# Values that hold no tensor, recognised by their exact type.
_LEAVES = frozenset({bool, int, float, complex, str, bytes, type(None), torch.dtype,
                     torch.device, torch.Size})
# Containers whose emptiness is asked without running user code (a module's
# hook dicts, empty in nearly every module).
_PLAIN_CONTAINERS = frozenset({dict, collections.OrderedDict, list, tuple, set, frozenset})


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
    seen_objects: set[int] = set()  # plain objects (a config held by every layer): once
    pending: list[tuple[str, nn.Module]] = [("", module)]
    grad_of = _grad_reader()
    while pending:
        root_prefix, root = pending.pop()
        for prefix, sub in _modules_under(root_prefix, root, seen_modules):
            if check_fn is not None and not check_fn(sub):
                continue
            for name, t in sub._parameters.items():
                if t is not None:
                    yield Reached(_join(prefix, name), sub, PARAMETER, t)
                    grad = grad_of(t)
                    if grad is not None:
                        yield Reached(_join(prefix, name) + ".grad", sub, GRAD, grad, t)
            for name, buffer in sub._buffers.items():
                if buffer is not None:
                    yield Reached(_join(prefix, name), sub, BUFFER, buffer)
            for name, value in sub.__dict__.items():
                # Most of a module's __dict__ is flags, sizes and empty hook
                # dicts: skipped before any isinstance (which, on an object with
                # its own __getattribute__ such as a transformers config, runs it).
                kind = type(value)
                if (kind in _LEAVES or (kind in _PLAIN_CONTAINERS and not value)
                        or name in _SKIPPED or id(value) in seen_objects):
                    continue
                for path, found in _look_into(_join(prefix, name), value, 0, set(), seen_objects):
                    if isinstance(found, nn.Module):
                        pending.append((path, found))  # kept unregistered, in a container
                    else:
                        yield Reached(path, sub, ATTRIBUTE, found)


def _modules_under(prefix: str, root: nn.Module,
                   seen: set[int]) -> Iterator[tuple[str, nn.Module]]:
    """``root.named_modules(prefix=prefix)`` without the modules in ``seen`` (added to
    it), in the same order. A seen module's submodules were all seen with it,
    so the walk stops there; an explicit stack, as nested generators cost a
    frame per level per module."""
    stack = [(prefix, root)]
    while stack:
        path, sub = stack.pop()
        if id(sub) in seen:
            continue
        seen.add(id(sub))
        yield path, sub
        children = [(_join(path, name), child) for name, child in sub._modules.items()
                    if child is not None]
        stack.extend(reversed(children))


def _grad_reader() -> Callable[[torch.Tensor], torch.Tensor | None]:
    """How to read a parameter's ``.grad``: for a deferred one, straight from the
    tensor (its ``__torch_function__`` would enter a recording to return the same
    object, ~20 us per parameter); for any other, as the user would."""
    recorded = DeferredTensor.__torch_function__.__func__  # type: ignore[attr-defined]

    def grad_of(t: torch.Tensor) -> torch.Tensor | None:
        if getattr(type(t).__torch_function__, "__func__", None) is recorded:
            with _compat.DisableTorchFunctionSubclass():
                return t.grad
        return t.grad

    return grad_of


def _look_into(path: str, value: object, depth: int, seen: set[int], objects: set[int]):
    # By type(value), never isinstance: isinstance asks a non-matching object for
    # its __class__, which runs a user __getattribute__ (a transformers config's)
    # once per check; and an object posing as a tensor is not one.
    cls = type(value)
    if cls in _LEAVES:
        return
    if issubclass(cls, torch.Tensor):
        yield path, value
        return
    if depth > 0 and issubclass(cls, nn.Module):
        yield path, value
        return
    if depth >= _MAX_DEPTH or id(value) in seen:
        return
    items = _items(path, value, cls)
    if items is None:
        return
    if not issubclass(cls, _CONTAINERS):
        if id(value) in objects:
            return
        objects.add(id(value))
    seen.add(id(value))
    for item_path, item in items:
        yield from _look_into(item_path, item, depth + 1, seen, objects)


def _items(path: str, value: Any, cls: type) -> Iterable[tuple[str, object]] | None:
    """The (path, member) pairs of a container or plain object, or None for a leaf."""
    if issubclass(cls, dict):
        return ((f"{path}[{k!r}]", v) for k, v in value.items())
    if issubclass(cls, _CONTAINERS):
        return ((f"{path}[{i}]", v) for i, v in enumerate(value))
    if issubclass(cls, functools.partial):
        return [*((f"{path}.args[{i}]", a) for i, a in enumerate(value.args)),
                *((f"{path}.keywords[{k!r}]", v) for k, v in value.keywords.items())]
    if issubclass(cls, _NOT_LOOKED_INTO) or value is None:
        return None
    if (cls.__module__ or "").partition(".")[0] in _STDLIB:
        return None
    members = dict(getattr(value, "__dict__", None) or {})
    for base in cls.__mro__:
        slots = base.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                members.setdefault(name, getattr(value, name))
    return ((f"{path}.{k}", v) for k, v in members.items())


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def is_deferred(obj: object) -> bool:
    """Whether a tensor is deferred, or a module still reaches a deferred tensor.

    A module reaches its parameters and buffers, and tensors kept as plain
    attributes, also inside lists, tuples, dicts and sets (what
    ``materialize_module`` materializes; see ``recorder/_reach.py``).

    >>> import torch, torchdefer
    >>> m = torchdefer.deferred_init(torch.nn.Linear, 2, 2)
    >>> torchdefer.is_deferred(m), torchdefer.is_deferred(m.weight)
    (True, True)
    """
    if isinstance(obj, torch.nn.Module):
        return any(holds_deferred(r.tensor) for r in reached_tensors(obj))
    return holds_deferred(obj)
