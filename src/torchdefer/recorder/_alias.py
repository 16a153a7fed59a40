"""Which arguments an op writes, from its schema.

Which inputs its outputs alias is not read from the schema: ``recorder.record``
compares storages after the meta kernel ran, which also covers ops whose
annotations say less than they do (``Tensor(a)[]`` returns, ``unsafe_split``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AliasPlan", "alias_plan", "schema_values"]


@dataclass(frozen=True, slots=True)
class AliasPlan:
    names: tuple[str, ...]  # schema argument names, in order
    writes: tuple[int, ...]  # indices of arguments the op writes (`Tensor(a!)`)
    takes_storage: bool  # an argument is a Storage (set_.source_Storage)


_plans: dict[Any, AliasPlan] = {}


def alias_plan(func: Any) -> AliasPlan:
    plan = _plans.get(func)
    if plan is None:
        plan = _plans[func] = _build(func._schema)
    return plan


def _build(schema: Any) -> AliasPlan:
    names = tuple(a.name for a in schema.arguments)
    writes = tuple(
        i
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )
    takes_storage = any("Storage" in str(a.type) for a in schema.arguments)
    return AliasPlan(names, writes, takes_storage)


def schema_values(plan: AliasPlan, args: tuple, kwargs: dict) -> list[Any]:
    """The value of each schema argument, positional or keyword."""
    return [
        args[i] if i < len(args) else kwargs.get(name) for i, name in enumerate(plan.names)
    ]
