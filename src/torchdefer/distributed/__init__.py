"""Sharded materialization: deferred modules as inputs to PyTorch's own sharding.

``torch.distributed`` is the sharding engine (FSDP2 ``fully_shard``, DTensor,
FSDP1); this package only makes deferred tensors flow through it so that each
rank computes its own slice of each parameter: from its own rows where the
parameter's init allows it (``shard.py``), else through the full parameter,
freed at once.

FSDP2 takes deferred modules as they are: ``fully_shard`` slices each deferred
parameter, and the slicing is *recorded*, so each local shard is a deferred
tensor that knows how to compute exactly its slice of the eager value.
:func:`materialize_module` then replays those shards::

    model = torchdefer.deferred_init(Transformer, config)   # same seed on every rank
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    torchdefer.distributed.materialize_module(model)        # each rank: its own rows

The core :func:`torchdefer.materialize_module` never imports
``torch.distributed``; when it meets sharded deferred parameters it hands the
module to :func:`materialize_module` here (the top-level package wires that
in), so ``fully_shard(...)`` then ``torchdefer.materialize_module(model)``
works as users write it for meta-device models.

Nothing in this package runs at import time beyond importing
``torch.distributed``; the core never imports it.
"""

from __future__ import annotations

import torch

from torchdefer.errors import MissingDependencyError

if not torch.distributed.is_available():  # pragma: no cover - builds without distributed
    raise MissingDependencyError(
        "torchdefer.distributed needs torch.distributed, which this PyTorch build lacks "
        f"(torch {torch.__version__}). Install a PyTorch build with distributed support "
        "(the default wheels from pytorch.org on Linux)."
    )

from torchdefer.distributed._dtensor import materialize_dtensor
from torchdefer.distributed._fsdp1 import fsdp1_deferred_init, param_init_fn
from torchdefer.distributed._load import load_state_dict
from torchdefer.distributed._module import materialize_module

__all__ = [
    "fsdp1_deferred_init",
    "load_state_dict",
    "materialize_dtensor",
    "materialize_module",
    "param_init_fn",
]
