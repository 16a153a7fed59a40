"""Keys a module's own load logic supplies when a checkpoint lacks them.

``Module.load_state_dict`` lets each module adjust the state dict before its
keys are checked (``_load_from_state_dict``). torch's batch and instance norms
do: a checkpoint of an old version (``_metadata`` version < 2, or none at all,
as in a plain dict or a safetensors file) has no ``num_batches_tracked``, and
the module keeps its own value instead of reporting the key missing. So eager
``load_state_dict(strict=True)`` accepts such a checkpoint, and so must
:func:`torchdefer.load_state_dict`: the tensor keeps its own value (for a
deferred one, its recorded init, materialized like any missing tensor).

Only this rule of torch's own modules is reproduced here, by reading the same
attributes torch reads; a user module's ``_load_from_state_dict`` override or
load pre-hook is not run (it could do anything to real tensors).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from torchdefer._compat import NormBase
from torchdefer.checkpoint._targets import named_modules

__all__ = ["kept_keys"]


def kept_keys(module: nn.Module, versions: Mapping[str, Any] | None) -> frozenset[str]:
    """State-dict keys that keep the module's own value when absent from the checkpoint."""
    kept = set()
    for prefix, sub in named_modules(module):
        if isinstance(sub, NormBase) and sub.track_running_stats:
            metadata = (versions or {}).get(prefix, {})
            version = metadata.get("version") if isinstance(metadata, Mapping) else None
            if version is None or version < 2:  # as _NormBase._load_from_state_dict reads it
                kept.add(f"{prefix}.num_batches_tracked" if prefix else "num_batches_tracked")
    return frozenset(kept)
