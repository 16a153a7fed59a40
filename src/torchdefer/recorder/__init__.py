"""The recorder: every op on fake tensors, with storages, versions and RNG positions."""

from torchdefer.errors import RecordingError
from torchdefer.recorder import _entries
from torchdefer.recorder._api import deferred_init
from torchdefer.recorder._composite import composite, library_call_asking_is_meta
from torchdefer.recorder._context import deferred
from torchdefer.recorder._copy import deepcopy_deferred, shallow_copy_deferred
from torchdefer.recorder._fast import FAST_OPS
from torchdefer.recorder._graph import Graph, Node, NodeKind, Storage, TensorMeta, Value
from torchdefer.recorder._mode import RecordingMode
from torchdefer.recorder._reach import is_deferred
from torchdefer.recorder._record import data_read, record_call, record_data_set, record_general
from torchdefer.recorder._subclasses import detach_for_parameter, make_parameter
from torchdefer.recorder._target import Target, mark_materialized, target_of
from torchdefer.recorder._tensor import DeferredTensor

# Deferred tensors' calls reach the recorder through these (recorder/_entries.py).
_entries.bind(
    record_call=record_call,
    fast_ops=FAST_OPS,
    record_general=record_general,
    data_read=data_read,
    record_data_set=record_data_set,
    library_call_asking_is_meta=library_call_asking_is_meta,
    detach_for_parameter=detach_for_parameter,
    make_parameter=make_parameter,
    deepcopy_deferred=deepcopy_deferred,
    shallow_copy_deferred=shallow_copy_deferred,
)

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
