"""Which arguments an op writes and which inputs its outputs alias, from its schema."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AliasPlan", "alias_plan", "schema_values"]


@dataclass(frozen=True, slots=True)
class AliasPlan:
    names: tuple[str, ...]  # schema argument names, in order
    writes: tuple[int, ...]  # indices of arguments the op writes (`Tensor(a!)`)
    returns: tuple[int | None, ...]  # per return: index of the argument it aliases


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
    returns: list[int | None] = []
    for r in schema.returns:
        target = None
        if r.alias_info is not None:
            sets = set(r.alias_info.before_set)
            for i, a in enumerate(schema.arguments):
                if a.alias_info is not None and sets & set(a.alias_info.before_set):
                    target = i
                    break
        returns.append(target)
    return AliasPlan(names, writes, tuple(returns))


def schema_values(plan: AliasPlan, args: tuple, kwargs: dict) -> list[Any]:
    """The value of each schema argument, positional or keyword."""
    return [
        args[i] if i < len(args) else kwargs.get(name) for i, name in enumerate(plan.names)
    ]
