"""Text summaries of a (deferred) module: its tree with parameter counts, its memory."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from torchdefer.recorder._target import target_of
from torchdefer.recorder._tensor import DeferredTensor
from torchdefer.viz._format import DASH, TIMES, fmt_bytes, fmt_dtype

__all__ = ["memory_table", "module_tree"]


def module_tree(model: nn.Module) -> str:
    """The module tree, one line per module with its parameter count.

    Runs of identical numbered siblings (decoder layers) are one line marked
    with their count; modules whose parameters are already real say so.

    >>> import torch, torchdefer
    >>> m = torchdefer.deferred_init(lambda: torch.nn.Sequential(torch.nn.Linear(2, 2)))
    >>> print(module_tree(m))
    Sequential      6
    └── 0 (Linear)  6
    """
    rows = [(type(model).__name__, _count(model))]
    rows += list(_rows(model, ""))
    width = max(len(label) for label, _ in rows) + 2
    return "\n".join(f"{label:<{width}}{count}" for label, count in rows).rstrip()


def _rows(module: nn.Module, indent: str) -> Iterator[tuple[str, str]]:
    groups = _group(list(module._modules.items()))
    for i, (names, child) in enumerate(groups):
        last = i == len(groups) - 1
        branch = "└── " if last else "├── "
        name = names[0] if len(names) == 1 else f"{names[0]}{DASH}{names[-1]}"
        label = f"{indent}{branch}{name} ({type(child).__name__})"
        count = _count(child)
        if len(names) > 1:
            label += f" {TIMES}{len(names)}"
            count += " each"
        yield label, count
        yield from _rows(child, indent + ("    " if last else "│   "))


def _group(children: list[tuple[str, Any]]) -> list[tuple[list[str], nn.Module]]:
    """Consecutive numbered siblings with the same structure become one group."""
    groups: list[tuple[list[str], nn.Module]] = []
    previous: Any = None
    for name, child in children:
        if child is None:
            continue
        form = _form(child) if name.isdigit() else None
        if (form is not None and form == previous and groups
                and int(name) == int(groups[-1][0][-1]) + 1):
            groups[-1][0].append(name)
            continue
        groups.append(([name], child))
        previous = form
    return groups


def _form(module: nn.Module) -> tuple[Any, ...]:
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return (
        tuple((n, type(m).__name__) for n, m in module.named_modules()),
        tuple((n, tuple(t.shape), t.dtype, str(t.device), _is_real(t)) for n, t in tensors),
    )


def _is_real(t: torch.Tensor) -> bool:
    return not isinstance(t, DeferredTensor)


def _count(module: nn.Module) -> str:
    params = list(module.parameters())
    total = sum(p.numel() for p in params)
    real = sum(1 for p in params if _is_real(p))
    suffix = ""
    if params and real == len(params):
        suffix = " (real)"
    elif real:
        suffix = f" ({real} of {len(params)} real)"
    return f"{total:,}{suffix}"


def memory_table(model: nn.Module) -> str:
    """Bytes the parameters and buffers need, per device and dtype.

    Storage shared by several tensors (tied weights, views) is counted once.
    Tensors already real are counted and marked in their own column.

    >>> import torch, torchdefer
    >>> m = torchdefer.deferred_init(torch.nn.Linear, 1024, 1024, device="cuda")
    >>> print(memory_table(m).splitlines()[1].split())
    ['cuda:0', 'float32', '2', '1,049,600', '4.0', 'MiB', '0', 'B']
    """
    rows: dict[tuple[str, str], list[int]] = {}  # -> tensors, elements, bytes, real bytes
    seen_tensors: set[int] = set()
    seen_storages: set[Any] = set()
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) in seen_tensors:
            continue
        seen_tensors.add(id(t))
        device = str(t.fake_device if isinstance(t, DeferredTensor) else t.device)
        row = rows.setdefault((device, fmt_dtype(t.dtype)), [0, 0, 0, 0])
        row[0] += 1
        row[1] += t.numel()
        key, nbytes = _storage(t)
        if key not in seen_storages:
            seen_storages.add(key)
            row[2] += nbytes
            if _is_real(t):
                row[3] += nbytes
    header = ("device", "dtype", "tensors", "elements", "bytes", "already real")
    table = [header]
    for (device, dtype), (n, numel, nbytes, real) in sorted(rows.items()):
        table.append((device, dtype, str(n), f"{numel:,}", fmt_bytes(nbytes), fmt_bytes(real)))
    if len(rows) > 1:
        totals = [sum(r[i] for r in rows.values()) for i in range(4)]
        table.append(("total", "", str(totals[0]), f"{totals[1]:,}", fmt_bytes(totals[2]),
                      fmt_bytes(totals[3])))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        .rstrip()
        for r in table
    )


def _storage(t: torch.Tensor) -> tuple[Any, int]:
    if isinstance(t, DeferredTensor):
        storage = target_of(t).storage
        return ("deferred", id(storage)), storage.nbytes
    untyped = t.untyped_storage()
    if t.is_meta or untyped.data_ptr() == 0:
        return ("tensor", id(t)), untyped.nbytes()
    return ("real", str(t.device), untyped.data_ptr()), untyped.nbytes()
