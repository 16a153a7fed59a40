"""The recorder: every op on fake tensors, with storages, versions and RNG positions."""

from torchdefer.recorder.api import deferred_init
from torchdefer.recorder.composite import composite
from torchdefer.recorder.context import deferred
from torchdefer.recorder.errors import RecordingError
from torchdefer.recorder.graph import Graph, Node, NodeKind, Storage, TensorMeta, Value
from torchdefer.recorder.mode import RecordingMode
from torchdefer.recorder.target import Target, mark_materialized, target_of
from torchdefer.recorder.tensor import DeferredTensor, is_deferred

__all__ = [
    "DeferredTensor",
    "Graph",
    "Node",
    "NodeKind",
    "RecordingError",
    "RecordingMode",
    "Storage",
    "Target",
    "TensorMeta",
    "Value",
    "composite",
    "deferred",
    "deferred_init",
    "is_deferred",
    "mark_materialized",
    "target_of",
]
