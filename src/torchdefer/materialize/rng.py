"""Replaying random ops from private generator states; the global RNG is untouched.

Each stream epoch starts from the state recorded with it. The state before
each replayed op is kept, so reaching position ``k`` restores the nearest known
earlier state and runs the skipped random ops into scratch memory (freed at
once). Materializing tensors in any order thus draws exactly what eager code
drew. A default generator is *borrowed*: its state is saved, set, used and
restored in ``finally``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchdefer.materialize.cache import ReplayCache
from torchdefer.recorder._args import unflatten_call
from torchdefer.recorder.graph import Node, TensorMeta, Value
from torchdefer.recorder.rng import Stream, default_generator

if TYPE_CHECKING:
    from torchdefer.materialize.replay import Replay

__all__ = ["RngReplay"]


class RngReplay:
    """Runs the random nodes of one replay."""

    def __init__(self, replay: Replay, cache: ReplayCache) -> None:
        self.replay = replay
        self.cache = cache
        # One scratch buffer per device, grown to the largest skipped draw.
        # Fresh tensors per draw would be freed at once, but glibc keeps
        # freed memory below its mmap threshold: reverse-order materialization
        # of a 350M model held 1.5 GiB more than needed (bench/README.md).
        self._scratch: dict[torch.device, torch.UntypedStorage] = {}

    def run(self, node: Node, args: tuple, kwargs: dict) -> Any:
        stream, epoch, position = node.rng  # type: ignore[misc]
        device = self.replay.map_device(stream.device)
        states = self._states(stream, epoch, device)
        state = self._state_at(stream, epoch, position, device, states)
        out, after = _draw(node, stream, device, state, args, kwargs)
        states[position + 1] = after
        return out

    def _states(self, stream: Stream, epoch: int, device: torch.device) -> dict[int, Any]:
        key = (id(stream), epoch, str(device))
        states = self.cache.rng_states.get(key)
        if states is None:
            states = self.cache.rng_states[key] = {0: self._initial(stream, epoch, device)}
        return states

    def _initial(self, stream: Stream, epoch: int, device: torch.device) -> Any:
        recorded = stream.epochs[epoch].state
        if isinstance(recorded, tuple):  # ("seed", s): default CUDA generator, no CUDA then
            generator = torch.Generator(device=device)
            generator.manual_seed(recorded[1])
            return generator.get_state()
        if stream.device.type == device.type:
            return recorded
        # Replayed on another kind of device than recorded: start where that
        # device's default generator stood when recording began.
        graph = stream.epochs[epoch].calls[0].graph
        if device.type == "cpu":
            return graph.rng.cpu_start
        generator = torch.Generator(device=device)
        generator.manual_seed(torch.initial_seed())
        return generator.get_state()

    def _state_at(self, stream, epoch, position, device, states) -> Any:
        if position in states:
            return states[position]
        start = max(p for p in states if p <= position)
        calls = stream.epochs[epoch].calls
        for j in range(start, position):
            args, kwargs = self._scratch_args(calls[j], device)
            _, states[j + 1] = _draw(calls[j], stream, device, states[j], args, kwargs)
        return states[position]

    def _scratch_tensor(self, meta: TensorMeta, device: torch.device) -> torch.Tensor:
        """A tensor with ``meta``'s sizes and strides over the reused scratch buffer."""
        extent = 1 + sum((n - 1) * st for n, st in zip(meta.size, meta.stride) if n > 0)
        nbytes = extent * meta.dtype.itemsize if all(meta.size) else 0
        buffer = self._scratch.get(device)
        if buffer is None or buffer.nbytes() < nbytes:
            self._scratch[device] = buffer = torch.UntypedStorage(nbytes, device=device)
        out = torch.empty(0, dtype=meta.dtype, device=device)
        return out.set_(buffer, 0, meta.size, meta.stride)

    def _scratch_args(self, node: Node, device: torch.device) -> tuple[tuple, dict]:
        """Arguments that draw the same numbers as ``node`` did, into scratch memory."""
        written = {id(storage) for storage, _ in node.writes}
        reads = iter(node.reads)
        leaves = []
        for leaf in node.leaves:
            if isinstance(leaf, Value):
                version = next(reads)
                if id(leaf.storage) in written:
                    leaf = self._scratch_tensor(leaf.meta, device)
                else:  # e.g. the probabilities of bernoulli_(p_tensor): needs real values
                    leaf = self.replay.nested([(leaf, version)])[0]
            else:
                leaf = self.replay.map_leaf(leaf)
            leaves.append(leaf)
        return unflatten_call(leaves, node.spec)


def _draw(node, stream, device, state, args, kwargs) -> tuple[Any, Any]:
    """Run random ``node`` from generator ``state``; returns (output, state after)."""
    if stream.generator is None:
        generator = default_generator(device)
        if generator is None:
            raise RuntimeError(f"no default generator for {device}")
        saved = generator.get_state()
        try:
            generator.set_state(state)
            out = node.op(*args, **kwargs)
            return out, generator.get_state()
        finally:
            generator.set_state(saved)
    private = torch.Generator(device=device)
    private.set_state(state)

    args = tuple(private if isinstance(x, torch.Generator) else x for x in args)
    kwargs = {k: private if isinstance(x, torch.Generator) else x for k, x in kwargs.items()}
    out = node.op(*args, **kwargs)
    return out, private.get_state()
