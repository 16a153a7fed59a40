"""What a checkpoint writer writes: each tensor once, under which names, in which dtype.

The names are ``model.state_dict()``'s (hooks and ``_save_to_state_dict``
overrides honoured; ``keep_vars=True`` hands over the module's own tensor
objects, so nothing is recorded and ties are seen as the same object). Two
formats, two conventions for a tied tensor (one object under several names):

* safetensors cannot hold aliases, so one name is written, the one
  ``save_pretrained`` keeps: for a Hugging Face model the names that match a
  module's ``_tied_weights_keys`` are dropped (``from_pretrained`` ties them
  back from the config); for any other module the first name in sorted order,
  as ``safetensors.torch.save_model`` does (``torchdefer.load_state_dict`` and
  ``safetensors.torch.load_model`` fill every name of a tie from one);
* DCP writes every name, as ``dcp.save(model.state_dict())`` does, since
  ``dcp.load`` into a model's state dict asks for each of them.

``dtype=`` follows ``Module.to(dtype)``: floating point and complex tensors
are converted (rounded to the nearest value of ``dtype``, as ``.to`` does),
integer and bool tensors keep their dtype. Converting a complex tensor to a
real dtype would drop its imaginary part (``.to`` only warns); that is refused.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torchdefer.errors import CheckpointUsageError, CheckpointWriteError
from torchdefer.materialize._value import replays_on_meta
from torchdefer.recorder._tensor import DeferredTensor, holds_deferred

__all__ = ["Entry", "WritePlan", "is_hf_model", "plan_write", "written_dtype"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor object to write, and every name it is written under."""

    names: tuple[str, ...]
    tensor: torch.Tensor  # the module's own: deferred, or real (its current values)
    dtype: torch.dtype  # as written

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def nbytes(self) -> int:
        """Bytes as written."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def source_nbytes(self) -> int:
        """Bytes of the tensor once real, before any conversion."""
        return math.prod(self.shape) * self.tensor.dtype.itemsize


@dataclass(slots=True)
class WritePlan:
    """The entries in writing order, and the state that is not a tensor (extra state)."""

    entries: list[Entry]
    extras: dict[str, Any] = field(default_factory=dict)
    hf: bool = False  # a transformers PreTrainedModel
    # safetensors, other modules: dropped tie name -> the name written, noted in
    # the file's metadata as safetensors.torch.save_model notes it
    dropped: dict[str, str] = field(default_factory=dict)


def written_dtype(tensor: torch.Tensor, dtype: torch.dtype | None, name: str) -> torch.dtype:
    """The dtype ``tensor`` is written in: ``Module.to(dtype)``'s rule, complex-to-real refused."""
    if dtype is None or not (tensor.dtype.is_floating_point or tensor.dtype.is_complex):
        return tensor.dtype
    if tensor.dtype.is_complex and not dtype.is_complex:
        raise CheckpointWriteError(
            f"'{name}' is {tensor.dtype}; writing it as {dtype} would drop its imaginary part "
            "(Tensor.to only warns). Pass a complex dtype, or dtype=None and convert it "
            "yourself."
        )
    return dtype


def is_hf_model(model: nn.Module) -> bool:
    """Whether ``model`` is a transformers ``PreTrainedModel`` (never imports transformers)."""
    transformers = sys.modules.get("transformers")
    base = getattr(transformers, "PreTrainedModel", None) if transformers else None
    return base is not None and isinstance(model, base)


def plan_write(model: nn.Module, fmt: str, dtype: torch.dtype | None,
               state: dict[str, Any] | None = None) -> WritePlan:
    """The entries of ``model`` for format ``fmt`` (``"safetensors"`` or ``"dcp"``).

    ``state``: the part of ``model.state_dict(keep_vars=True)`` to write (default: all).
    """
    if state is None:
        state = model.state_dict(keep_vars=True)
    hf = is_hf_model(model)
    if hf:
        for key in getattr(model, "_keys_to_ignore_on_save", None) or ():
            state.pop(key, None)  # as save_pretrained
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    extras = {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}
    if extras and fmt == "safetensors":
        raise CheckpointWriteError(
            f"{_few(list(extras))} are not tensors (a module's get_extra_state), which "
            "safetensors cannot hold. Use format='dcp', or remove the extra state."
        )
    for name, t in tensors.items():
        _check_writable(name, t)
    groups = _alias_groups(tensors, fmt)
    if fmt == "safetensors":
        kept = _kept_names(groups, model, hf)  # in state-dict order, as save_pretrained
        entries = [Entry((n,), t, written_dtype(t, dtype, n)) for n, t in tensors.items()
                   if n in kept]
        dropped = {} if hf else {n: k for g in groups for k in g if k in kept
                                 for n in sorted(g) if n != k}
        return WritePlan(entries, extras, hf, dropped)
    entries = [Entry(tuple(g), tensors[g[0]], written_dtype(tensors[g[0]], dtype, g[0]))
               for g in groups]
    return WritePlan(entries, extras, hf)


def _check_writable(name: str, t: torch.Tensor) -> None:
    if t.layout != torch.strided or _is_wrapper(t):
        raise CheckpointWriteError(
            f"'{name}' is a {type(t).__name__} with layout {t.layout}; save_state_dict "
            "writes plain dense tensors only. Convert it (t.to_dense(), or the plain "
            "tensor a subclass wraps) before saving, or save it with dcp.save."
        )
    if isinstance(t, DeferredTensor):
        if replays_on_meta(t):
            raise CheckpointWriteError(
                f"'{name}' was recorded on the meta device, so it has no values to write. "
                "Build the model without torch.device('meta') (deferred_init allocates "
                "nothing anyway)."
            )
        return
    if holds_deferred(t):
        raise CheckpointUsageError(
            f"'{name}' is sharded ({type(t).__name__} around a deferred tensor). "
            "save_state_dict writes unsharded models; call it before fully_shard / "
            "distribute_tensor, or save the sharded model with torch.distributed.checkpoint."
        )
    if t.device.type == "meta":
        raise CheckpointWriteError(
            f"'{name}' is a meta tensor: it has no values to write. Build the model with "
            "torchdefer.deferred_init instead of on the meta device, or load weights first."
        )


def _is_wrapper(t: torch.Tensor) -> bool:
    """A tensor subclass that wraps others (DTensor, float8 tensors): not plain bytes."""
    from torchdefer._compat import is_traceable_wrapper_subclass

    return not isinstance(t, DeferredTensor) and is_traceable_wrapper_subclass(t)


def _alias_groups(tensors: dict[str, torch.Tensor], fmt: str) -> list[list[str]]:
    """Names grouped by what they hold: one group per tensor object, merged with other
    objects that are the very same view of the same storage (what safetensors and
    save_pretrained treat as one tensor). Views that overlap otherwise are refused
    for safetensors, which cannot express them."""
    by_object: dict[int, list[str]] = {}
    for name, t in tensors.items():
        by_object.setdefault(id(t), []).append(name)
    by_view: dict[tuple, list[str]] = {}
    by_storage: dict[tuple, list[tuple[int, int, str]]] = {}
    for names in by_object.values():
        t = tensors[names[0]]
        if t.numel() == 0:
            by_view[("empty", id(t))] = names
            continue
        storage = (str(t.device), t.untyped_storage().data_ptr())
        start = int(t.storage_offset()) * t.element_size()  # real tensors: no SymInts
        span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
        view = (*storage, start, t.dtype, tuple(t.shape), t.stride())
        if view in by_view:
            by_view[view].extend(names)
            continue
        by_view[view] = list(names)
        by_storage.setdefault(storage, []).append((start, start + span * t.element_size(),
                                                   names[0]))
    if fmt == "safetensors":
        for areas in by_storage.values():
            _refuse_overlaps(areas)
    return list(by_view.values())


def _refuse_overlaps(areas: list[tuple[int, int, str]]) -> None:
    areas.sort()
    _, stop, name = areas[0]
    for start, end, other in areas[1:]:
        if start < stop:
            raise CheckpointWriteError(
                f"'{name}' and '{other}' share part of one storage without being the same "
                "tensor; safetensors cannot store such aliases (save_pretrained refuses "
                "them too). Use format='dcp', or give one of them its own storage "
                "(.clone()) before saving."
            )
        if end > stop:
            stop, name = end, other


def _kept_names(groups: list[list[str]], model: nn.Module, hf: bool) -> set[str]:
    kept: set[str] = set()
    patterns = _tied_weight_patterns(model) if hf else []
    for names in groups:
        if len(names) == 1:
            kept.update(names)
        elif hf:
            kept.update(_hf_kept(names, patterns))
        else:
            kept.add(sorted(names)[0])  # safetensors.torch.save_model's choice
    return kept


def _hf_kept(names: list[str], patterns: list[str]) -> list[str]:
    """save_pretrained's rule: drop the names its tied-weights keys declare, keep one."""
    dropped, found = set(), 0
    for name in sorted(names):
        if any(re.search(p, name) for p in patterns):
            found += 1
            if found < len(names):
                dropped.add(name)
    left = [n for n in names if n not in dropped]
    if len(left) > 1:
        raise CheckpointWriteError(
            f"{_few(left)} are one tensor (tied), but no module's _tied_weights_keys declares "
            "the tie, so from_pretrained would not tie them back and would initialize the "
            "dropped ones at random (save_pretrained refuses this too). Declare the tie in "
            "_tied_weights_keys, untie them, or use format='dcp'."
        )
    return left


def _tied_weight_patterns(model: nn.Module) -> list[str]:
    """The tied-weights keys of every submodule, prefixed (transformers' own list)."""
    patterns: list[str] = []
    for prefix, sub in model.named_modules():
        tied = getattr(sub, "_tied_weights_keys", None) or {}
        keys = tied.keys() if isinstance(tied, dict) else tied
        patterns.extend(f"{prefix}.{k}" if prefix else k for k in keys)
    return patterns


def _few(names: list[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")
