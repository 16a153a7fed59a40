"""The in-place fills that make up most of a model's construction, recorded in one step.

``normal_``, ``uniform_`` and ``fill_`` on a whole floating-point deferred
tensor with plain number arguments are about half of the ops a large model's
``__init__`` records (1285 of the 70B Llama's 2748). ``record_call`` answers
them after a dozen general steps (flattening, schema walks, write and resize
plans, the refusal questions, output wrapping); here, once the arguments are
seen to be of that plain form, the node is built directly, with exactly the
fields the general path gives it (``tests/recorder/test_fast_fills.py``
records the same programs both ways and compares the graphs field by field).

What is deliberately *not* here: anything with a tensor or generator argument,
keyword arguments, other dtypes, meta tensors, overlapping strides,
out-of-range numbers, writes into inference tensors. Those return
:data:`SLOW`, and the general path, with its checks and PyTorch's own errors,
answers them.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdefer.recorder._refusals import writes_inference
from torchdefer.recorder._storage import write
from torchdefer.recorder.ambient import current_ambient
from torchdefer.recorder.graph import Graph, Node, NodeKind, Value
from torchdefer.recorder.source import user_frame

__all__ = ["SLOW", "fast_fill"]

SLOW = object()
"""What :func:`fast_fill` returns when the call is not of the plain form."""

_NORMAL_ = torch.ops.aten.normal_.default
_UNIFORM_ = torch.ops.aten.uniform_.default
_FILL_ = torch.ops.aten.fill_.Scalar
# Largest finite value per dtype: uniform_ refuses bounds beyond it, fill_
# refuses values it cannot convert.
_LIMITS = {d: torch.finfo(d).max for d in (torch.float16, torch.bfloat16, torch.float32,
                                           torch.float64)}
# flatten_call's spec of (self, *numbers) with no keywords, by number of arguments.
_SPECS = {n: (n, (), (None,) * n) for n in range(1, 4)}


def fast_fill(graph: Graph, func: Any, args: tuple, kwargs: dict) -> Any:
    """Record ``func(*args)`` (a fill of ``FAST_OPS``) as ``record_call`` would; else SLOW."""
    if kwargs or not _plain(func, args, graph):
        return SLOW
    self = args[0]
    value = self._value
    storage = value.storage
    if writes_inference((self,)):  # eager writes, then refuses: the general path's case
        return SLOW
    leaves = [value, *args[1:]]
    node = Node(graph.next_seq(), NodeKind.CALL, func, leaves, _SPECS[len(args)], (value,),
                (storage.version,))
    node.source = user_frame(2)
    node.graph = graph
    node.ambient = current_ambient()
    node.writes = (write(node, storage),)
    # In place, metadata untouched: the same object holds a new value.
    self._value = Value(node, 0, storage, value.meta)
    node.outputs.append(self._value)
    if func is _FILL_:
        node.kind = NodeKind.INPLACE
    else:
        node.kind = NodeKind.RANDOM
        graph.rng.place(node, None, self.fake_device)
    return self


def _plain(func: Any, args: tuple, graph: Graph) -> bool:
    """Whether the call is of the plain form (see the module docstring)."""
    n = len(args)
    if n > (2 if func is _FILL_ else 3) or (func is _FILL_ and n != 2):
        return False
    self = args[0]
    if getattr(self, "_graph", None) is not graph:
        return False
    meta = self._value.meta
    limit = _LIMITS.get(meta.dtype)
    if limit is None or meta.device.type == "meta" or meta.conj or meta.neg:
        return False
    for size, stride in zip(meta.size, meta.stride):
        if stride == 0 and size > 1:  # internal overlap: eager refuses the write
            return False
    for x in args[1:]:
        if (type(x) is not float and type(x) is not int) or not abs(x) <= limit:
            return False
    if func is _NORMAL_:
        return n < 3 or args[2] >= 0
    if func is _UNIFORM_:
        low = args[1] if n > 1 else 0.0
        high = args[2] if n > 2 else 1.0
        return low <= high and high - low <= limit
    return True


FAST_OPS: dict[int, Any] = {id(f): fast_fill for f in (_NORMAL_, _UNIFORM_, _FILL_)}
"""``id(op overload)`` -> its one-step recorder (OpOverload's hash is Python: by id)."""
