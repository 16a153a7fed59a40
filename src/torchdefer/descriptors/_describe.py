"""``describe``: input descriptors for a whole signature, from example calls."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from torchdefer.descriptors._call import call_error
from torchdefer.descriptors._meta_tensor_type import examples_descriptor
from torchdefer.descriptors._object_of import node_keys, unflatten
from torchdefer.descriptors._tree import Descriptor
from torchdefer.errors import UsageError, UsageTypeError

__all__ = ["describe"]


def describe(
    fn: torch.nn.Module | Callable[..., object],
    *example_calls: tuple[object, ...] | Mapping[str, object],
) -> dict[str, Descriptor]:
    """The most specific input descriptors that every example call satisfies.

    Per tensor, properties equal in every call are kept (as in
    :meth:`MetaTensorType.from_examples`); lengths that vary but are equal to
    each other in every call share one name across tensors (the example's
    ``x`` and ``mask``). Other arguments equal in every call become values,
    else types. Containers of classes other than Python's and torch's
    (a dataclass, a pytree-registered class) are
    :class:`~torchdefer.descriptors.ObjectOf`, never built around descriptors.

    Args:
        fn: a module (its ``forward``) or a function.
        *example_calls: each a tuple of positional arguments or a dict of
            keyword arguments.

    Returns:
        ``input_descriptors`` ready for :func:`~torchdefer.script`.

    Example:
        >>> import torch
        >>> def f(x, mask, flag):
        ...     return x
        >>> d = describe(f, (torch.zeros(2, 4), torch.ones(2), True),
        ...                 (torch.zeros(5, 4), torch.ones(5), True))
        >>> d["x"].shape, d["mask"].shape, d["flag"]
        (('d0', 4), ('d0',), True)
    """
    if not example_calls:
        raise UsageError("describe() needs at least one example call")
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    sig = inspect.signature(target)
    bound = []
    for i, call in enumerate(example_calls):
        args, kwargs = ((), dict(call)) if isinstance(call, Mapping) else (tuple(call), {})
        try:
            b = sig.bind(*args, **kwargs)
        except TypeError as e:
            qualname = getattr(target, "__qualname__", type(target).__name__)
            why = None if _variadic(sig) else call_error(qualname, sig, args, kwargs,
                                                         inspect.ismethod(target))
            raise UsageTypeError(
                f"describe(): example call {i} does not fit {sig}: {why or e}") from e
        bound.append(dict(b.arguments))
    shared: dict[tuple[int, ...], str] = {}  # lengths across calls -> name, over all tensors
    return {n: _common([b[n] for b in bound], n, shared)
            for n in sig.parameters if all(n in b for b in bound)}


def _common(values: list[Any], path: str, shared: dict[tuple[int, ...], str]) -> Any:
    """The descriptor of one argument's values across the calls."""
    flat = [pytree.tree_flatten(v) for v in values]
    if any(spec != flat[0][1] for _, spec in flat):
        raise UsageTypeError(f"describe(): {path} differs in structure across example calls; "
                             "describe it by hand")
    leaves = [_leaf(list(column), path, shared) for column in zip(*(leaves for leaves, _ in flat))]
    # Containers of the model's own classes are ObjectOf: never built around descriptors.
    return unflatten(flat[0][1], iter(leaves), iter(node_keys(values[0], flat[0][1])))


def _variadic(sig: inspect.Signature) -> bool:
    """Whether ``sig`` takes ``*args`` or ``**kwargs`` (Python's words then differ)."""
    return any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values())


def _leaf(values: list[Any], path: str, shared: dict[tuple[int, ...], str]) -> Any:
    kinds = {type(v) for v in values}
    if all(isinstance(v, torch.Tensor) for v in values):
        return examples_descriptor(values, shared)
    if len(kinds) == 1 and all(v == values[0] for v in values):
        return values[0]
    if len(kinds) == 1 and kinds <= {int, float, bool, str}:
        return kinds.pop()
    if kinds <= {int, float}:
        return float
    raise UsageTypeError(f"describe(): {path} differs in kind across example calls "
                         f"({', '.join(sorted(k.__name__ for k in kinds))}); describe it by hand")
