"""Materialization: slice the graph for a tensor, replay it on a device, swap into modules."""

from torchdefer.materialize.api import materialize_module, materialize_tensor
from torchdefer.materialize.checkpoint import LoadResult, load_state_dict
from torchdefer.materialize.errors import (
    DeviceUnavailableError,
    ExternalTensorModifiedError,
    ReplayError,
    SwapError,
)
from torchdefer.materialize.replay import Replay

__all__ = [
    "DeviceUnavailableError",
    "ExternalTensorModifiedError",
    "LoadResult",
    "Replay",
    "ReplayError",
    "SwapError",
    "load_state_dict",
    "materialize_module",
    "materialize_tensor",
]
