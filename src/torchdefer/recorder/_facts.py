"""What recording needs to know about an op that its arguments cannot change, once per op.

``record_call`` runs for every op a model's construction makes (thousands for
a large model). Each fact below is a property of the op overload alone (its
schema, tags, namespace, packet), so it is computed the first time the op is
seen and then read from one dictionary. The dictionary is keyed by ``id``:
``OpOverload.__hash__`` is Python code, and a lookup by the op itself cost more
than several of the checks it answers. The entry keeps the op alive, so its id
cannot be reused by another object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torchdefer.fake._questions import is_question
from torchdefer.recorder._alias import AliasPlan, alias_plan
from torchdefer.recorder._collectives import collective_name
from torchdefer.rng.draws import known_random_op, may_draw_untagged

__all__ = ["OpFacts", "facts_of"]

# Ops whose output shape or value depends on the data (no meta kernel can say
# what they return). Replay is deterministic, so computing them once from the
# materialized inputs gives exactly what replay would; the result is kept as a
# constant and the read is recorded.
_DATA_DEPENDENT = frozenset(
    getattr(torch.ops.aten, name)
    for name in (
        "nonzero", "masked_select", "_unique", "_unique2", "unique_dim",
        "unique_consecutive", "bincount", "equal", "allclose", "is_nonzero",
    )
)
_INDEX = torch.ops.aten.index.Tensor
_REPEAT_INTERLEAVE = torch.ops.aten.repeat_interleave

# OpFacts.needs_data: never, always, or when an index argument is a boolean mask.
NEVER, ALWAYS, BOOL_INDEX = 0, 1, 2


@dataclass(frozen=True, slots=True)
class OpFacts:
    """The facts about one op overload that ``record_call`` reads on every call."""

    func: Any  # kept alive: the cache is keyed by its id
    plan: AliasPlan
    needs_data: int  # NEVER, ALWAYS or BOOL_INDEX
    question: bool  # returns only plain values and writes nothing
    takes_dtype: bool  # a keyword-only `dtype` argument
    random: bool  # draws from a generator (tagged, or known untagged)
    untagged: bool  # from a library whose untagged ops may still draw
    # Schema positions of Generator arguments: a generator can reach an op
    # only through one of them (empty for nearly every op).
    generators: tuple[tuple[int, str], ...]
    # The name of a collective (refused: see recorder/_collectives.py), else "".
    collective: str
    # Not simply recorded (record_call's first branches): a collective, aten.to,
    # lift_fresh, _local_scalar_dense. One flag: other ops pay one test for all.
    special: bool


_facts: dict[int, OpFacts] = {}


def facts_of(func: Any) -> OpFacts:
    """The :class:`OpFacts` of ``func`` (an ``OpOverload``)."""
    facts = _facts.get(id(func))
    if facts is None:
        facts = _facts[id(func)] = _compute(func)
    return facts


def _compute(func: Any) -> OpFacts:
    schema = func._schema
    collective = collective_name(func)
    return OpFacts(
        func=func,
        plan=alias_plan(func),
        needs_data=_needs_data(func),
        question=is_question(func),
        takes_dtype=any(a.name == "dtype" and a.kwarg_only for a in schema.arguments),
        random=known_random_op(func),
        untagged=may_draw_untagged(func),
        generators=tuple(
            (i, a.name) for i, a in enumerate(schema.arguments) if "Generator" in str(a.type)
        ),
        collective=collective,
        special=bool(collective) or func.overloadpacket is torch.ops.aten.to or func in _SPECIAL,
    )


_SPECIAL = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default,
            torch.ops.aten._local_scalar_dense.default)


def _needs_data(func: Any) -> int:
    packet = func.overloadpacket
    if packet in _DATA_DEPENDENT:
        return ALWAYS
    if packet is _REPEAT_INTERLEAVE:
        return NEVER if func is torch.ops.aten.repeat_interleave.self_int else ALWAYS
    return BOOL_INDEX if func is _INDEX else NEVER
