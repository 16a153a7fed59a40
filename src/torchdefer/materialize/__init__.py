"""Materialization: slice the graph for a tensor, replay it on a device, swap into modules.

Loading checkpoints lives in :mod:`torchdefer.checkpoint`.
"""

from torchdefer.errors import (
    DeviceUnavailableError,
    ExternalTensorModifiedError,
    ReplayError,
    SwapError,
)
from torchdefer.materialize._api import materialize_module, materialize_tensor
from torchdefer.materialize._replay import Replay

__all__ = [
    "DeviceUnavailableError",
    "ExternalTensorModifiedError",
    "Replay",
    "ReplayError",
    "SwapError",
    "materialize_module",
    "materialize_tensor",
]
