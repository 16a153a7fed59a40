"""Load weights into deferred, real and sharded modules: validate first, then assign.

Sources: a state dict, ``torch.save`` files (read ``weights_only``), a
safetensors file or directory (index honoured), a
``torch.distributed.checkpoint`` directory (metadata read through an
allowlist). Nothing in a file is ever run, a damaged or mismatched file is
refused with an error naming the file and key, and a refused load changes
nothing. One internal module per noun: ``_source`` (what a checkpoint
declares), ``_safetensors_files`` / ``_torch_save`` / ``_dcp`` (the readers),
``_targets`` (the module's tensors), ``_plan`` (validation), ``_assign``
(preparing tensors), ``_install`` (every change to the module, checked first,
then made all together), ``_load`` (the entry point). Writing: ``_write`` (the
entry point, :func:`save_state_dict`), ``_write_plan`` (what is written under
which names), and the format writers. The error classes are in
:mod:`torchdefer.errors`, re-exported here.
"""

from torchdefer.checkpoint._load import load_state_dict
from torchdefer.checkpoint._plan import LoadResult
from torchdefer.checkpoint._write import save_state_dict
from torchdefer.errors import (
    CheckpointDeviceError,
    CheckpointError,
    CheckpointExistsError,
    CheckpointFormatError,
    CheckpointKeyError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointRankError,
    CheckpointUsageError,
    CheckpointWriteError,
    UnsafeCheckpointError,
)

__all__ = [
    "CheckpointDeviceError",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointFormatError",
    "CheckpointKeyError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointRankError",
    "CheckpointUsageError",
    "CheckpointWriteError",
    "LoadResult",
    "UnsafeCheckpointError",
    "load_state_dict",
    "save_state_dict",
]
