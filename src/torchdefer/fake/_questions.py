"""Answers to ops that ask about tensors (bool/int results) which meta kernels get wrong.

Most such ops (``is_same_size``, ``result_type``, ``can_cast``, ``is_contiguous``)
are answered from metadata by their own kernels, on meta as on a real device.
These are not:

* ``is_set_to`` has no meta kernel: it compares storages, offsets, sizes and
  strides, which fake tensors have (their meta storages alias as real ones do);
* ``is_pinned`` on meta says nothing of the storage a fake tensor stands for:
  a deferred tensor's recorded storage knows whether it was pinned
  (``fake._pinned``); ``_pin_memory``, which has no meta kernel, is answered
  there too (eager's checks, then an output of the input's layout).

Ops that need data (``equal``, ``is_nonzero``, ``item``) are not answered here:
the recorder computes them from materialized values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchdefer import _compat
from torchdefer.fake._pinned import is_pinned, pin_memory_output

__all__ = ["ANSWERS", "is_question"]

aten = torch.ops.aten


def _is_set_to(self: torch.Tensor, src: torch.Tensor) -> bool:
    # aten/src/ATen/native/TensorProperties.cpp: same storage, offset, sizes, strides.
    return (
        _compat.storage_id(self) == _compat.storage_id(src)
        and self.storage_offset() == src.storage_offset()
        and self.shape == src.shape
        and self.stride() == src.stride()
    )


ANSWERS: dict[Any, Callable[..., Any]] = {
    aten.is_set_to.default: _is_set_to,
    aten.is_pinned.default: is_pinned,
    aten._pin_memory.default: pin_memory_output,  # a tensor, on the CPU, as run_on_meta says
}

_questions: dict[Any, bool] = {}


def is_question(func: Any) -> bool:
    """An op that returns only plain values (bool, int, dtype) and writes nothing."""
    known = _questions.get(func)
    if known is None:
        schema = func._schema
        known = _questions[func] = bool(schema.returns) and not any(
            "Tensor" in str(r.type) for r in schema.returns
        ) and not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    return known
