"""Load weights into deferred, real and sharded modules: validate first, then assign.

Sources: a state dict, ``torch.save`` files (read ``weights_only``), a
safetensors file or directory (index honoured), a
``torch.distributed.checkpoint`` directory (metadata read through an
allowlist). Nothing in a file is ever run, a damaged or mismatched file is
refused with an error naming the file and key, and a refused load changes
nothing. One module per noun: ``source`` (what a checkpoint declares),
``safetensors_files`` / ``torch_save`` / ``dcp`` (the readers), ``targets``
(the module's tensors), ``plan`` (validation), ``assign`` (preparing
tensors), ``install`` (every change to the module, checked first, then made
all together), ``load`` (the entry point). Writing: ``write`` (the
entry point, :func:`save_state_dict`), ``write_plan`` (what is written under
which names), ``write_errors``, and the private format writers.
"""

from torchdefer.checkpoint.errors import (
    CheckpointDeviceError,
    CheckpointError,
    CheckpointFormatError,
    CheckpointKeyError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointRankError,
    CheckpointUsageError,
    UnsafeCheckpointError,
)
from torchdefer.checkpoint.load import load_state_dict
from torchdefer.checkpoint.plan import LoadResult
from torchdefer.checkpoint.write import save_state_dict
from torchdefer.checkpoint.write_errors import CheckpointExistsError, CheckpointWriteError

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
