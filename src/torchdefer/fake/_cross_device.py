"""Which ops accept tensors on different devices: eager PyTorch's rules, for fake tensors.

Meta kernels never see two devices, so without this check ``cuda_t + cpu_t``
would be recorded and fail only at materialization (or, replayed on one
device, silently succeed). Eager PyTorch decides in two places:

* the dispatcher wrapper of an accelerator kernel checks that every tensor
  argument is on exactly the same device (``check_and_update_common_device``,
  for every op whose ``native_functions.yaml`` entry does not say
  ``device_check: NoCheck``);
* TensorIterator ops (``device_check: NoCheck``) accept CPU 0-dim tensors
  among their inputs, and nothing else from another device.

A few ``NoCheck`` ops have rules of their own: ``copy_``/``_to_copy``/``to``
move data between devices, ``view_as``-like ops look at shapes only, and
indexing takes its indices on the CPU. This mirrors PyTorch's own
``FakeTensor._find_common_device`` (which applies the TensorIterator rule to
every op) with the per-op ``device_check`` that eager applies on top.

Which ops say ``NoCheck`` is read lazily, at the first call that mixes
devices, from the ``native_functions.yaml`` packaged with torch (torchgen).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from torchdefer.fake._output_device import first_conflict
from torchdefer.fake._state import STATE

__all__ = ["check_devices"]

# Mixing allowed: moves between devices, shape-only ops, questions.
_FREE = frozenset(
    {
        "copy_", "_to_copy", "to", "_copy_from", "_copy_from_and_resize", "view_as",
        "expand_as", "reshape_as", "broadcast_tensors", "is_same_size", "is_set_to",
        "_has_same_storage_numel", "_foreach_copy", "_foreach_copy_", "lift_fresh",
        "lift_fresh_copy",
    }
)
# Indices may live on the CPU (TensorIndexing / index_put's meta move them).
_INDEXING = frozenset(
    {"index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"}
)

# Filled through a CPU index by indexing's fast path (torch >= 2.15 sends
# `t[[0, 2], 1] = 5.0` to index_fill_ when index and t share a device). Inside
# a guarded binding a tensor on a device this host lacks reports the CPU (see
# reported_device), so the fast path is taken where eager, seeing two
# devices, would run index_put_, which takes CPU indices: same values.
_FILLED_BY_SETITEM = frozenset({"index_fill_", "index_fill"})


def check_devices(func: Any, args: tuple, kwargs: dict, device_of: Any) -> None:
    """Raise eager's RuntimeError if this call mixes devices in a way eager refuses.

    Called only once a call is known to hold tensors on two devices (meta aside).
    ``device_of(t)`` is the device a tensor reports (the fake device for fakes).
    """
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.name.startswith("aten::"):
        return  # custom ops: their kernels decide; nothing to mirror
    base = schema.name[6:]
    if base in _FREE:
        return
    tensors = list(_named_tensors(schema, args, kwargs))
    if base in _INDEXING or (base in _FILLED_BY_SETITEM and STATE.guarded):
        tensors = [t for t in tensors
                   if t[0] not in ("indices", "index") or device_of(t[1]).type != "cpu"]
        _iterator_rule(func, tensors, device_of)
        return
    name = base if not schema.overload_name else f"{base}.{schema.overload_name}"
    if _no_check(name):
        _iterator_rule(func, tensors, device_of)
    else:
        _exact_rule(func, tensors, device_of)


def _exact_rule(func: Any, tensors: list, device_of: Any) -> None:
    hit = first_conflict([t for _, t, _ in tensors], device_of)
    if hit is not None:
        i, common, device = hit
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but got {tensors[i][0]} is on "
            f"{device}, different from other tensors on {common} (when checking "
            f"argument in method {func}){_where()}"
        )


def _iterator_rule(func: Any, tensors: list, device_of: Any) -> None:
    # CPU 0-dim inputs ride along with any device; outputs never do.
    common = None
    for _, t, written in tensors:
        device = device_of(t)
        if device.type != "meta" and (written or not _cpu_scalar(t, device)):
            common = common or device
            if device != common:
                break
    else:
        return
    raise RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{common} and {device}! (in {func}){_where()}"
    )


def _cpu_scalar(t: torch.Tensor, device: torch.device) -> bool:
    return device.type == "cpu" and t.dim() == 0


def _named_tensors(schema: Any, args: tuple, kwargs: dict):
    """``(argument name, tensor, written)`` for every tensor argument, in schema order."""
    for i, a in enumerate(schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(a.name)
        written = a.alias_info is not None and a.alias_info.is_write
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            if isinstance(item, torch.Tensor):
                yield a.name, item, written


def _where() -> str:
    from torchdefer.fake._source import user_frame

    frame = user_frame(4)
    return "" if frame is None else f"; called at {frame}"


def _no_check(name: str) -> bool:
    """Whether the op ``name`` (``add.Tensor``) is marked ``device_check: NoCheck``.

    Without the yaml (a stripped install) every op gets the TensorIterator rule,
    as in PyTorch's FakeTensor: CPU scalars pass, other mixes raise.
    """
    names = _read_no_check()
    return names is None or name in names


@functools.cache
def _read_no_check() -> frozenset[str] | None:
    """Names of the ops eager does not check for one device, read once.

    Those marked ``device_check: NoCheck``, and those whose only kernels are
    ``Composite*`` ones: torchgen emits ``check_and_update_common_device``
    only in the wrappers of device-guarded backends (CUDA, XPU), so a
    composite kernel such as ``randint_like.Tensor`` (a CPU 0-dim ``high``
    with a CUDA ``self``) runs on mixed devices and leaves the check to the
    ops it calls.
    """
    try:
        import torchgen

        path = os.path.join(
            os.path.dirname(torchgen.__file__), "packaged", "ATen", "native",
            "native_functions.yaml",
        )
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (ImportError, OSError):
        return None
    names = set()
    current = None
    keys: dict[str, set[str]] = {}  # op -> its dispatch keys
    in_dispatch = False
    for line in lines:
        if line.startswith("- func:"):
            current = line[len("- func:"):].strip().split("(", 1)[0]
            in_dispatch = False
        elif current is not None and line.strip().startswith("device_check:"):
            if line.split(":", 1)[1].split("#", 1)[0].strip() == "NoCheck":
                names.add(current)
        elif current is not None and line.startswith("  dispatch:"):
            in_dispatch = True
        elif in_dispatch and current is not None and line.startswith("    ") and ":" in line:
            declared = line.split(":", 1)[0].strip()
            if not declared.startswith("#"):
                keys.setdefault(current, set()).update(k.strip() for k in declared.split(","))
        elif not line.startswith("    "):
            in_dispatch = False
    names.update(op for op, ks in keys.items() if all(k.startswith("Composite") for k in ks))
    return frozenset(names)
