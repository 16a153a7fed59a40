"""torchdefer: build PyTorch models of any size without allocating them.

Construct a model with :func:`deferred_init` (fake tensors that report the real
device, every operation recorded), look at it, then :func:`materialize_module`
replays the recording per tensor onto a real device, bit for bit what eager
construction would have produced.

>>> import torch, torchdefer
>>> _ = torch.manual_seed(0); eager = torch.nn.Linear(4, 2)
>>> _ = torch.manual_seed(0); lazy = torchdefer.deferred_init(torch.nn.Linear, 4, 2)
>>> torchdefer.is_deferred(lazy)
True
>>> torch.equal(torchdefer.materialize_module(lazy).weight, eager.weight)
True

The extensions (``descriptors``, ``viz``, ``distributed``) build on the core and
are imported lazily, so ``import torchdefer`` stays cheap and the core never
depends on them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from torchdefer._hooks import DISTRIBUTED_LOADER, SHARDED_MATERIALIZER, SHARDED_WRITER
from torchdefer.checkpoint import load_state_dict, save_state_dict
from torchdefer.errors import TorchdeferError
from torchdefer.fake import fake_mode, is_fake
from torchdefer.materialize import materialize_module, materialize_tensor
from torchdefer.recorder import composite, deferred, deferred_init, is_deferred

__all__ = [
    "DescriptorMismatch",
    "MetaTensorType",
    "TorchdeferError",
    "composite",
    "deferred",
    "deferred_init",
    "describe",
    "explain",
    "fake_mode",
    "is_deferred",
    "is_fake",
    "load_program",
    "load_state_dict",
    "materialize_module",
    "materialize_tensor",
    "save_program",
    "save_state_dict",
    "script",
]

if TYPE_CHECKING:  # what type checkers see of the lazily resolved names below
    from torchdefer.descriptors import (
        DescriptorMismatch,
        MetaTensorType,
        describe,
        load,  # noqa: F401 (deprecated name, resolved lazily)
        load_program,
        save,  # noqa: F401 (deprecated name, resolved lazily)
        save_program,
        script,
    )
    from torchdefer.viz import explain

# Names that live in extension packages, resolved on first use (PEP 562).
_LAZY = {
    "DescriptorMismatch": "torchdefer.descriptors",
    "MetaTensorType": "torchdefer.descriptors",
    "describe": "torchdefer.descriptors",
    "load": "torchdefer.descriptors",  # deprecated: load_program
    "load_program": "torchdefer.descriptors",
    "save": "torchdefer.descriptors",  # deprecated: save_program
    "save_program": "torchdefer.descriptors",
    "script": "torchdefer.descriptors",
    "explain": "torchdefer.viz",
}


def _materialize_sharded(module: Any) -> Any:
    # The composition root wires the distributed extension into the core: the
    # core never imports it, and it is imported only when a sharded module
    # actually reaches materialize_module.
    return importlib.import_module("torchdefer.distributed").materialize_module(module)


def _load_distributed(module: Any, source: Any, **options: Any) -> Any:
    # Sharded modules: the distributed extension, imported
    # only when one is actually loaded.
    loader = importlib.import_module("torchdefer.distributed._load").load_state_dict
    return loader(module, source, **options)


def _save_sharded(model: Any, path: Any, **options: Any) -> Any:
    # Models with DTensor tensors: each rank writes its shards (distributed extension).
    writer = importlib.import_module("torchdefer.distributed._save").save_sharded
    return writer(model, path, **options)


SHARDED_MATERIALIZER.install(_materialize_sharded)
DISTRIBUTED_LOADER.install(_load_distributed)
SHARDED_WRITER.install(_save_sharded)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchdefer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
