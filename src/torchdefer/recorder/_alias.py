"""Which arguments an op writes: its schema's ``(a!)``, and the writes it does not declare.

A few native ops update inputs their schema does not mark as written: batch
norm's running statistics (``native_batch_norm``, ``cudnn_batch_norm``,
``miopen_batch_norm``, the sync-BN gather ops, ``batch_norm_update_stats``) and
cuDNN/MIOpen RNN dropout states. Recorded as reads, the running stats of a
"dry run to infer a size" forward pass would come out as their initial
values. ``UNANNOTATED_WRITES`` lists them, ``.out`` overloads included, from a
scan of native_functions.yaml for torch 2.13 (``tests/recorder/test_unannotated_writes.py``
checks that the listed arguments still exist and are still unannotated, and
that every overload of the installed torch with such an argument is listed); the kernels write
these arguments in place without bumping their version counters, so replay
cannot detect them afterwards.

Which inputs its outputs alias is not read from the schema: ``recorder._record``
compares storages after the meta kernel ran, which also covers ops whose
annotations say less than they do (``Tensor(a)[]`` returns, ``unsafe_split``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torchdefer import _compat

__all__ = ["UNANNOTATED_WRITES", "AliasPlan", "alias_plan", "overlapping_write", "schema_values",
           "writes_of"]

aten = torch.ops.aten


def _when(flag: int, *, positive: int | None = None) -> Callable[[list[Any]], bool]:
    """Written when argument ``flag`` is true (and argument ``positive`` > 0)."""
    return lambda v: bool(v[flag]) and (positive is None or (v[positive] or 0) > 0)


def _always(values: list[Any]) -> bool:
    return True


# op -> (indices of the arguments it writes without saying so, when it does)
UNANNOTATED_WRITES: dict[Any, tuple[tuple[int, ...], Callable[[list[Any]], bool]]] = {
    aten.native_batch_norm.default: ((3, 4), _when(5)),  # running_mean/var if training
    aten.native_batch_norm.out: ((3, 4), _when(5)),
    aten.cudnn_batch_norm.default: ((3, 4), _when(5)),
    aten.cudnn_batch_norm.out: ((3, 4), _when(5)),
    aten.miopen_batch_norm.default: ((3, 4), _when(5)),
    aten.miopen_batch_norm.out: ((3, 4), _when(5)),
    aten.batch_norm_update_stats.default: ((1, 2), _always),
    aten.batch_norm_update_stats.out: ((1, 2), _always),
    aten.batch_norm_gather_stats.default: ((3, 4), _always),
    aten.batch_norm_gather_stats.out: ((3, 4), _always),
    aten.batch_norm_gather_stats_with_counts.default: ((3, 4), _always),
    aten.batch_norm_gather_stats_with_counts.out: ((3, 4), _always),
    # Composite (decomposed before our dispatch sees them), listed for callers
    # of torch.ops directly under another dispatch key.
    aten.batch_norm.default: ((3, 4), _when(5)),
    aten._batch_norm_impl_index.default: ((3, 4), _when(5)),
    aten.instance_norm.default: ((3, 4), _when(5)),
    aten._cudnn_rnn.default: ((15,), _when(12, positive=11)),  # dropout_state
    aten._cudnn_rnn.out: ((15,), _when(12, positive=11)),
    aten.miopen_rnn.default: ((13,), _when(10, positive=9)),
    aten.miopen_rnn.out: ((13,), _when(10, positive=9)),
}


@dataclass(frozen=True, slots=True)
class AliasPlan:
    names: tuple[str, ...]  # schema argument names, in order
    writes: tuple[int, ...]  # indices of arguments the op writes (`Tensor(a!)`)
    takes_storage: bool  # an argument is a Storage (set_.source_Storage)
    # Arguments written without an annotation, and when (UNANNOTATED_WRITES).
    hidden: tuple[tuple[int, ...], Callable[[list[Any]], bool]] | None = None
    # A return that is a new tensor, not a written argument (batch norm's output).
    fresh_returns: bool = False


_plans: dict[Any, AliasPlan] = {}


def alias_plan(func: Any) -> AliasPlan:
    plan = _plans.get(func)
    if plan is None:
        plan = _plans[func] = _build(func._schema, UNANNOTATED_WRITES.get(func))
    return plan


def _build(schema: Any, hidden: Any) -> AliasPlan:
    names = tuple(a.name for a in schema.arguments)
    writes = tuple(
        i
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )
    takes_storage = any("Storage" in str(a.type) for a in schema.arguments)
    fresh = any(r.alias_info is None for r in schema.returns)
    return AliasPlan(names, writes, takes_storage, hidden, fresh)


def writes_of(plan: AliasPlan, values: list[Any]) -> tuple[int, ...]:
    """Indices of the arguments this call writes (``values`` from ``schema_values``)."""
    if plan.hidden is None:
        return plan.writes
    indices, when = plan.hidden
    return plan.writes + indices if when(values) else plan.writes


def schema_values(plan: AliasPlan, args: tuple, kwargs: dict) -> list[Any]:
    """The value of each schema argument, positional or keyword."""
    return [
        args[i] if i < len(args) else kwargs.get(name) for i, name in enumerate(plan.names)
    ]


# Tensors up to this many elements are compared element by element; larger ones
# whose byte ranges meet count as overlapping.
_EXACT = 1 << 12


def overlapping_write(plan: AliasPlan, values: list[Any], writes: tuple[int, ...]
                      ) -> tuple[str, str] | None:
    """The names of a written argument and another argument sharing memory with it;
    else None. Asked of ops that return new tensors or write without saying so.

    Such a call (``native_batch_norm`` whose ``running_mean`` is a view of its
    ``input``) reads memory while writing it, so what it computes depends on the
    order the kernel reads and writes in, which replay does not reproduce: it is
    refused at the call (``recorder._record``). Ops whose outputs are their
    declared written arguments (``mm(a, b, out=a)``, ``add_``) replay onto the
    same memory as eager and are not asked; TensorIterator's own overlap
    refusals are eager's (``recorder._refusals``).
    """
    with _compat.DisableTorchFunctionSubclass():  # plain metadata reads
        for i in writes:
            w = values[i]
            if not hasattr(w, "_value"):
                continue  # a list (an RNN's weights) or None: nothing written here
            for j, x in enumerate(values):
                if j == i or not hasattr(x, "_value"):
                    continue
                if x._value.storage is w._value.storage and _shares_memory(w, x):
                    return plan.names[i], plan.names[j]
    return None


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors on one storage have an element's bytes in common."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    if a1 <= b0 or b1 <= a0:
        return False
    if a.element_size() != b.element_size() or max(a.numel(), b.numel()) > _EXACT:
        return True
    return not _offsets(a).isdisjoint(_offsets(b))


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    size, first = t.element_size(), int(t.storage_offset())
    last = first + sum((int(n) - 1) * s for n, s in zip(t.shape, t.stride()))
    return first * size, (last + 1) * size


def _offsets(t: torch.Tensor) -> set[int]:
    offsets = {int(t.storage_offset())}
    for n, s in zip(t.shape, t.stride()):
        offsets = {o + k * s for o in offsets for k in range(int(n))}
    return offsets
