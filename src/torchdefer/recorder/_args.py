"""Flattening an aten call's arguments, specialised to what aten calls contain.

``torch.utils._pytree`` handles any nesting and costs ~40 µs a call, half the
recording time of a large model. Aten arguments nest at most one level (a
tensor list, an int list), so a flat list plus a small shape tuple does.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ArgSpec", "flatten_call", "flatten_out", "unflatten_call"]

# (number of positional args, keyword names, per argument: None for a leaf or
# (list or tuple, length) for a sequence spread into the leaves)
ArgSpec = tuple[int, tuple[str, ...], tuple[Any, ...]]


def flatten_call(args: tuple, kwargs: dict) -> tuple[list[Any], ArgSpec]:
    leaves: list[Any] = []
    shape: list[Any] = []
    for a in (*args, *kwargs.values()):
        kind = type(a)
        if kind is list or kind is tuple:
            shape.append((kind, len(a)))
            leaves.extend(a)
        else:
            shape.append(None)
            leaves.append(a)
    return leaves, (len(args), tuple(kwargs), tuple(shape))


def unflatten_call(leaves: list[Any], spec: ArgSpec) -> tuple[tuple, dict]:
    n_args, keys, shape = spec
    values: list[Any] = []
    i = 0
    for s in shape:
        if s is None:
            values.append(leaves[i])
            i += 1
        else:
            kind, n = s
            values.append(kind(leaves[i : i + n]))
            i += n
    return tuple(values[:n_args]), dict(zip(keys, values[n_args:], strict=True))


def flatten_out(out: Any) -> list[Any]:
    """The outputs of an aten call as a list (a tensor, a tuple/list of them, or None)."""
    kind = type(out)
    if kind is tuple or kind is list:
        return list(out)
    return [out]
