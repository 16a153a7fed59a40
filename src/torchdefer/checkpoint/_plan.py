"""Validate first: which keys load, which are missing, and whether every entry fits.

Everything here looks at declared entries only (names, shapes, dtypes, and
what each reader found wrong), never at tensor data, and raises before the
module is touched.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from torchdefer.checkpoint._source import CheckpointSource
from torchdefer.checkpoint._targets import TensorGroup
from torchdefer.errors import (
    CheckpointDeviceError,
    CheckpointKeyError,
    CheckpointMismatchError,
)
from torchdefer.fake._output_device import device_available, missing_device
from torchdefer.recorder._target import target_of
from torchdefer.recorder._tensor import DeferredTensor

__all__ = ["LoadResult", "check_devices", "check_entries", "few", "plan_keys", "work_list"]


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What :func:`torchdefer.load_state_dict` did, key by key (``module.state_dict()`` names)."""

    loaded_keys: tuple[str, ...]  # assigned from the checkpoint
    missing_keys: tuple[str, ...]  # not in the checkpoint: materialized from the recording
    unexpected_keys: tuple[str, ...]  # in the checkpoint, not in the module: ignored


def plan_keys(groups: list[TensorGroup], source: CheckpointSource, strict: bool,
              kept: frozenset[str] = frozenset()) -> LoadResult:
    """Sort the keys into loaded, missing and unexpected; raise or warn as asked.

    A checkpoint none of whose keys the module has is refused even when not
    strict: loading it would silently leave the whole model at its init.
    ``kept``: keys the modules' own load logic supplies when absent
    (``checkpoint._module_rules``): never missing for ``strict``, as in eager.
    """
    keys = list(source.entries)
    present = set(keys)
    persistent = [g for g in groups if g.persistent]
    known = {n for g in persistent for n in g.names}
    loaded = tuple(n for g in persistent for n in g.names if n in present)
    # A tied group is filled by any one of its names (HF checkpoints store one).
    missing = tuple(n for g in persistent if not present.intersection(g.names) for n in g.names)
    unexpected = tuple(k for k in keys if k not in known)
    if strict and (set(missing) - kept or unexpected):
        raise CheckpointKeyError(
            f"Loading {source.where} with strict=True: missing keys "
            f"{few(tuple(n for n in missing if n not in kept))}, unexpected "
            f"keys {few(unexpected)}. Pass strict=False to materialize missing tensors "
            "from the recording and ignore unexpected ones."
        )
    if keys and known and not loaded:
        raise CheckpointKeyError(
            f"None of the {len(keys)} keys of {source.where} ({few(tuple(keys))}) is a key of "
            f"the module ({few(tuple(sorted(known)))}); loading it would leave every tensor at "
            f"its init.{_prefix_hint(keys, known)}{_nested_hint(source)} Check that this "
            "checkpoint belongs to this "
            "model, or rename its keys."
        )
    if unexpected:
        warnings.warn(
            f"{source.where} has {len(unexpected)} keys the module does not: {few(unexpected)}; "
            "they were not loaded.",
            stacklevel=4,
        )
    return LoadResult(loaded, missing, unexpected)


def work_list(groups: list[TensorGroup],
              source: CheckpointSource) -> list[tuple[TensorGroup, list[str]]]:
    """Each persistent group the checkpoint fills, with the names it has for it."""
    work = [(g, [n for n in g.names if n in source.entries]) for g in groups]
    return [(g, names) for g, names in work if names]


def check_entries(work: list[tuple[TensorGroup, list[str]]], source: CheckpointSource,
                  shape_of=None) -> None:
    """Every entry the load reads is a readable tensor of the module tensor's shape."""
    for group, names in work:
        expected = tuple((shape_of or _shape)(group.tensor))
        for name in names:
            entry = source.entries[name]
            if entry.problem is not None:
                raise entry.error(
                    f"'{name}' in {entry.where} {entry.problem}; the module needs a tensor of "
                    f"shape {expected} there. Nothing was loaded. Re-save the checkpoint, or "
                    "drop the key."
                )
            if entry.shape != expected:
                raise CheckpointMismatchError(
                    f"'{name}' has shape {expected} in the module but {entry.shape} in "
                    f"{entry.where}; check that the checkpoint belongs to this model and "
                    "config. Nothing was loaded."
                )


def check_devices(groups: list[TensorGroup], loaded: set[int], device: torch.device | None,
                  materialize_missing: bool) -> None:
    """Every deferred tensor the load will make real has a device this process has."""
    for group in groups:
        t = group.tensor
        if not isinstance(t, DeferredTensor) or (id(t) not in loaded and not materialize_missing):
            continue
        place = device or t.fake_device
        if not device_available(place):
            where = missing_device(t.fake_device, place, device is not None, "loaded onto")
            raise CheckpointDeviceError(
                f"'{group.path}' {where}, which this process does not have. Pass a device "
                "it has (e.g. torchdefer.load_state_dict(model, path, device='cpu')). "
                "Nothing was loaded."
            )


def few(names: tuple[str, ...]) -> str:
    if not names:
        return "none"
    shown = ", ".join(repr(n) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    if isinstance(t, DeferredTensor):
        return tuple(target_of(t).meta.size)  # recorded: no call on the deferred tensor
    return tuple(t.shape)


def _nested_hint(source: CheckpointSource) -> str:
    """Say so when the state dict sits one level down (``{"model": state_dict, ...}``)."""
    nested = [k for k, e in source.entries.items() if e.problem and "holds a dict" in e.problem]
    if not nested:
        return ""
    return (f" Its key '{nested[0]}' holds a dict: pass that one "
            f"(torch.load(path, weights_only=True)['{nested[0]}']).")


def _prefix_hint(keys: list[str], known: set[str]) -> str:
    """Say so when the keys match once a first component is added or removed."""
    stripped = {k.split(".", 1)[1] for k in keys if "." in k}
    if stripped & known:
        prefix = next(k.split(".", 1)[0] for k in keys if "." in k and k.split(".", 1)[1] in known)
        return f" The checkpoint's keys carry a prefix '{prefix}.' the module's lack."
    ours = {k.split(".", 1)[1] for k in known if "." in k}
    if ours & set(keys):
        prefix = next(k.split(".", 1)[0] for k in known if "." in k and k.split(".", 1)[1] in keys)
        return f" The module's keys carry a prefix '{prefix}.' the checkpoint's lack."
    return ""
