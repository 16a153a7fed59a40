"""A bitwise fingerprint of a model's tensors, to compare runs in different processes.

Materialized weights must equal eager ones bit for bit (the tests check that on
small models); the benchmark checks it again on the big ones, where eager and
deferred ran in two processes, by comparing fingerprints. Computed in chunks
so it does not itself move the memory numbers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

from torchdefer._compat import hash_tensor

__all__ = ["fingerprint"]

_CHUNK = 1 << 22  # elements hashed at a time


def fingerprint(state: torch.nn.Module | Mapping[str, torch.Tensor]) -> str:
    """A hex digest of a state dict (or a module's): names, dtypes, shapes and bits."""
    digest = hashlib.blake2b(digest_size=16)
    if isinstance(state, torch.nn.Module):
        state = state.state_dict(keep_vars=True)
    with torch.no_grad():
        for name in sorted(state):
            t = state[name].detach()
            digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            flat = t.contiguous().reshape(-1)
            if flat.dtype.is_floating_point and flat.element_size() in (2, 4, 8):
                bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
                flat = flat.view(bits)
            for chunk in flat.split(_CHUNK):
                # xor of the bits and a position-weighted sum: order matters.
                weights = torch.arange(1, chunk.numel() + 1, dtype=torch.int64)
                mixed = (chunk.to(torch.int64) * weights).sum()
                xor = hash_tensor(chunk).view(torch.int64).item()
                digest.update(xor.to_bytes(8, "little", signed=True))
                digest.update(int(mixed).to_bytes(16, "little", signed=True))
    return digest.hexdigest()
