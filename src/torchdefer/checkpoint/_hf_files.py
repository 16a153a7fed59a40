"""The files besides the weights that make a directory one ``from_pretrained`` opens.

``save_pretrained`` writes ``config.json`` (with ``dtype`` set to the model's
dtype and ``architectures`` to its class) and, for models that generate,
``generation_config.json``. The same files are written here from the model's
config, without changing the model's own config object. Remote-code models
(whose files ``save_pretrained`` also copies) are not handled.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from torchdefer.checkpoint.write_errors import CheckpointWriteError

__all__ = ["check_no_conversions", "total_parameters", "write_configs"]


def write_configs(model: nn.Module, directory: Path, dtype: torch.dtype | None) -> None:
    """config.json (and generation_config.json) as save_pretrained writes them."""
    config = copy.deepcopy(model.config)
    written = dtype if dtype is not None and dtype.is_floating_point else model.dtype
    config.dtype = str(written).removeprefix("torch.")
    config.architectures = [type(model).__name__.removeprefix("FSDP")]
    config.save_pretrained(directory)
    if model.can_generate():
        model.generation_config.save_pretrained(directory)


def total_parameters(model: nn.Module) -> int:
    """The index's ``total_parameters``: ``model.num_parameters()``, as save_pretrained."""
    return int(model.num_parameters())


def check_no_conversions(model: nn.Module) -> None:
    """Refuse models transformers stores in another layout than their modules.

    Models with weight conversions (fused MoE experts, renamed keys) are
    written by ``save_pretrained`` in their original checkpoint layout, after
    ops over several tensors at once; writing the module's own names instead
    would give a directory ``from_pretrained`` reads differently.
    """
    conversions = getattr(model, "_weight_conversions", None)
    if conversions is None:
        try:
            from transformers.conversion_mapping import get_model_conversion_mapping
            from transformers.core_model_loading import PrefixChange
        except ImportError:  # a transformers without conversions
            return
        conversions = [c for c in get_model_conversion_mapping(model, add_legacy=False)
                       if not isinstance(c, PrefixChange)]
    if conversions:
        raise CheckpointWriteError(
            f"transformers saves {type(model).__name__} in another layout than its modules "
            f"({len(conversions)} weight conversion(s), e.g. {conversions[0]!r}), which "
            "save_state_dict does not reproduce. Use format='dcp', or materialize the model "
            "and call save_pretrained."
        )
