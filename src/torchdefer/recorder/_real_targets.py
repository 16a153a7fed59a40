"""Calls on deferred tensors whose effect lands outside the recording.

Two kinds of call cannot be deferred, because their effect is not a value of
the recorded graph:

* a *collective* (``torch.distributed.broadcast``, ``scatter``, the
  functional collectives of DTensor and FSDP): its result comes from other
  ranks' data, which no rank has while the tensors are deferred. Refused,
  with the fix (``distribute_tensor(..., src_data_rank=None)`` when every
  rank builds the same model from the same seed, or materialize first);
* an in-place write into a *real* tensor, outside ``deferred_init``
  (``eager.load_state_dict(deferred.state_dict())`` calls
  ``real.copy_(deferred)``): eager code writes values there now, so the
  deferred values are computed (as ``.item()`` is) and written.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdefer import _compat
from torchdefer._hooks import VALUE_READER
from torchdefer.fake.tensor import FakeTensor, flat_tensors
from torchdefer.recorder.errors import RecordingError
from torchdefer.recorder.source import user_frame

__all__ = ["collective_name", "refuse_collective", "write_real", "writes_in_place",
           "writes_real"]

_FAKE_SLOT = _compat.FAKE_MODE_KEY
# Namespaces of the collective ops (c10d: process-group ops; the functional
# ones are what DTensor redistribution and FSDP2 all-gathers dispatch).
_COLLECTIVE_NAMESPACES = frozenset(
    {"c10d", "_c10d_functional", "_c10d_functional_autograd", "c10d_functional", "_dtensor"}
)
# In-place methods that do not write values (or write storage, not values).
_NOT_VALUE_WRITES = frozenset({"requires_grad_", "set_", "share_memory_", "retain_grad"})


def refuse_collective(func: Any) -> None:
    """Raise if ``func`` is a collective (a ``torch.distributed`` call or a c10d op)."""
    if type(func) is _OP_OVERLOAD:  # by id: OpOverload.__hash__ is Python code
        entry = _ops.get(id(func))
        if entry is None:
            entry = _ops[id(func)] = (func, collective_name(func))
        known: str | None = entry[1]
    else:
        known = _collectives.get(func)
        if known is None:
            known = _collectives[func] = collective_name(func)
    if known:
        raise _collective_error(known)


# func -> its name if it is a collective, else "" (this runs on every op).
_collectives: dict[Any, str] = {}
# The same for aten-level ops, by id; the op is kept, so its id stays its own.
_ops: dict[int, tuple[Any, str]] = {}
_OP_OVERLOAD = _compat.OpOverload


def collective_name(func: Any) -> str:
    """``func``'s name if it is a collective, else ``""``."""
    namespace = getattr(func, "namespace", None)
    if namespace is not None:  # an aten-level op
        return str(func) if namespace in _COLLECTIVE_NAMESPACES else ""
    module = getattr(func, "__module__", None) or ""
    if not module.startswith("torch.distributed"):
        return ""
    return f"{module}.{getattr(func, '__name__', func)}"


def _collective_error(name: str) -> RecordingError:
    frame = user_frame(3)
    where = "<unknown location>" if frame is None else f"{frame[0]}:{frame[1]} in {frame[2]}"
    return RecordingError(
        f"{name} was called on a deferred tensor (at {where}). A collective needs the "
        "tensor's data, which no rank has until it is materialized, so its result cannot "
        "be recorded. If it comes from distribute_tensor or parallelize_module: pass "
        "src_data_rank=None (every rank built the same model from the same seed, so each "
        "rank's own slice is bit for bit what rank 0 would send), then "
        "torchdefer.distributed.materialize_module(model); for DTensor.from_local pass "
        "run_check=False. Otherwise materialize first (torchdefer.materialize_module) and "
        "run the collective on real tensors."
    )


def writes_in_place(func: Any) -> bool:
    """Whether ``func`` writes values into its first argument (``add_``, ``+=``)."""
    in_place = _in_place.get(func)
    if in_place is None:
        in_place = _in_place[func] = _writes_first_argument(func)
    return in_place


def writes_real(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``func`` writes values into a real tensor, with no recording active."""
    target = writes_in_place(func) and bool(args) and _is_real(args[0])
    if not target and "out" in kwargs:
        out = kwargs["out"]
        outs = out if isinstance(out, (tuple, list)) else (out,)
        target = any(_is_real(o) for o in outs)
    # Inside deferred_init the recorder refuses such writes, as for any real tensor.
    return target and not isinstance(_compat.get_dispatch_mode(_FAKE_SLOT), _recording_mode())


_in_place: dict[Any, bool] = {}


def _writes_first_argument(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    if name in _NOT_VALUE_WRITES:
        return False
    if name.endswith("_") and not name.startswith("_"):  # add_, copy_, masked_fill_
        return True
    return name == "__setitem__" or (name.startswith("__i") and name.endswith("__"))  # +=


def write_real(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on real tensors: every deferred argument replaced by its value."""
    from torchdefer.recorder.tensor import DeferredTensor

    def real(x: Any) -> Any:
        return VALUE_READER.get()(x) if isinstance(x, DeferredTensor) else x

    args = tuple(
        type(a)(real(b) for b in a) if isinstance(a, (list, tuple)) else real(a) for a in args
    )
    kwargs = {k: real(v) for k, v in kwargs.items()}
    if any(isinstance(t, FakeTensor) for t in flat_tensors(args, kwargs)):
        return NotImplemented  # a plain fake tensor among them: not ours to compute
    with _compat.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def _is_real(t: Any) -> bool:
    from torchdefer.recorder.tensor import holds_deferred

    return isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) and not holds_deferred(t)


def _recording_mode() -> type:
    from torchdefer.recorder.mode import RecordingMode

    return RecordingMode
