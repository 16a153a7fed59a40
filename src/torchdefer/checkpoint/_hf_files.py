"""The files besides the weights that make a directory one ``from_pretrained`` opens.

``save_pretrained`` writes ``config.json`` (with ``dtype`` set to the model's
dtype and ``architectures`` to its class) and, for models that generate,
``generation_config.json``. The same files are written here from the model's
config, without changing the model's own config object, and the tensor names
are the ones ``save_pretrained`` writes (:func:`saved_layout`). Remote-code
models (whose files ``save_pretrained`` also copies) are not handled.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from torchdefer.checkpoint._write_plan import Entry
from torchdefer.errors import CheckpointWriteError

if TYPE_CHECKING:  # an optional dependency: the models these functions get are its
    from transformers import PreTrainedModel

__all__ = ["pretrained", "saved_layout", "total_parameters", "write_configs"]


def pretrained(model: nn.Module) -> PreTrainedModel:
    """``model`` as the transformers model ``WritePlan.hf`` found it to be (no check)."""
    return cast("PreTrainedModel", model)


def write_configs(model: PreTrainedModel, directory: Path, dtype: torch.dtype | None) -> None:
    """config.json (and generation_config.json) as save_pretrained writes them."""
    config = copy.deepcopy(model.config)
    written = dtype if dtype is not None and dtype.is_floating_point else model.dtype
    config.dtype = str(written).removeprefix("torch.")
    config.architectures = [type(model).__name__.removeprefix("FSDP")]
    config.save_pretrained(directory)
    if model.can_generate():
        model.generation_config.save_pretrained(directory)


def total_parameters(model: PreTrainedModel) -> int:
    """The index's ``total_parameters``: ``model.num_parameters()``, as save_pretrained."""
    return int(model.num_parameters())


def saved_layout(model: PreTrainedModel, entries: list[Entry]) -> list[Entry]:
    """``entries`` under the names and in the order ``save_pretrained`` writes them.

    Models whose checkpoint layout differs from their modules (ViT, Llava,
    GraniteMoe, ...) are saved by ``save_pretrained`` through transformers'
    ``revert_weight_conversion``. That function is run here on one meta
    placeholder per tensor: where it only renames (``WeightRenaming``), every
    placeholder comes back, as itself, under its saved name, in the order
    ``save_pretrained`` writes (sorted by ``dot_natural_key``); the written
    values are then the module's. Anything else it does (a ``WeightConverter``
    that fuses, splits or transposes tensors) is refused.
    """
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers without weight conversions
        _refuse_legacy_mapping(model)
        return entries
    placeholders = {e.name: torch.empty(e.shape, dtype=e.dtype, device="meta") for e in entries}
    by_id = {id(t): e for t, e in zip(placeholders.values(), entries, strict=True)}
    try:
        reverted = revert_weight_conversion(model, dict(placeholders))
    except Exception as e:  # a converter that cannot run on placeholders: not a rename
        raise _conversion_error(model, f"it raised {type(e).__name__}: {e}") from e
    if reverted is placeholders or list(reverted) == list(placeholders):
        return entries  # nothing renamed (the quick escape, or renames that match nothing)
    out, seen = [], set()
    for name, value in reverted.items():
        entry = by_id.get(id(value))
        if entry is None or id(value) in seen:
            raise _conversion_error(model, f"the saved '{name}' is not a module tensor renamed")
        seen.add(id(value))
        out.append(dataclasses.replace(entry, names=(name,)))
    if len(out) != len(entries):
        lost = [e.name for e in entries if id(placeholders[e.name]) not in seen]
        raise _conversion_error(model, f"{_few(lost)} would not be saved")
    return out


def _conversion_error(model: PreTrainedModel, what: str) -> CheckpointWriteError:
    converters = [c for c in _conversions(model) if type(c).__name__ == "WeightConverter"]
    shown = converters[0] if converters else (_conversions(model) or ["?"])[0]
    return CheckpointWriteError(
        f"transformers saves {type(model).__name__} in its original checkpoint layout through "
        f"weight conversions that are not renames ({len(converters)} WeightConverter(s), e.g. "
        f"{shown!r}; {what}). save_state_dict writes renamed tensors only, never tensors "
        "computed from several. Use format='dcp' (the module's own names), or materialize "
        "the model and call save_pretrained."
    )


def _conversions(model: PreTrainedModel) -> list:
    """The transforms save_pretrained reverts (as revert_weight_conversion finds them)."""
    conversions = getattr(model, "_weight_conversions", None)
    if conversions is not None:
        return list(conversions)
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import PrefixChange
    except ImportError:
        return []
    return [c for c in get_model_conversion_mapping(model, add_legacy=False)
            if not isinstance(c, PrefixChange)]


def _refuse_legacy_mapping(model: PreTrainedModel) -> None:
    for sub in model.modules():
        if getattr(sub, "_checkpoint_conversion_mapping", None):
            raise CheckpointWriteError(
                f"{type(sub).__name__} declares _checkpoint_conversion_mapping, which "
                "save_pretrained of this transformers version applies in reverse; "
                "save_state_dict does not reproduce it here. Upgrade transformers (>= 5), "
                "use format='dcp', or materialize the model and call save_pretrained."
            )


def _few(names: list[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")
