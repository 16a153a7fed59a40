"""What materialization keeps between calls, per graph: real storages."""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from torchdefer.recorder.graph import Graph, Storage, Value

__all__ = ["ReplayCache", "cache_for"]


class ReplayCache:
    """Real storages already produced, held weakly.

    Storages are held through ``StorageWeakRef`` so a materialized tensor the
    user drops is freed; while it lives, tensors that shared its storage in
    eager code are rebuilt as views of it (shared storage stays shared, and
    nothing is computed twice).
    """

    def __init__(self) -> None:
        # (storage, device key) -> (storage record, weak ref, version)
        self._storages: dict[tuple[int, str], tuple[Storage, StorageWeakRef, int]] = {}

    def lookup(self, value: Value, version: int, device_key: str, device: torch.device):
        entry = self._storages.get((id(value.storage), device_key))
        if entry is None or entry[2] != version or entry[1].expired():
            return None
        storage = torch.UntypedStorage._new_with_weak_ptr(entry[1].cdata)
        meta = value.meta
        out = torch.empty(0, dtype=meta.dtype, device=device)
        return out.set_(storage, meta.offset, meta.size, meta.stride)

    def store(self, value: Value, version: int, device_key: str, real: torch.Tensor) -> None:
        ref = StorageWeakRef(real.untyped_storage())
        self._storages[(id(value.storage), device_key)] = (value.storage, ref, version)


def cache_for(graph: Graph) -> ReplayCache:
    if graph.replay_cache is None:
        graph.replay_cache = ReplayCache()
    return graph.replay_cache
