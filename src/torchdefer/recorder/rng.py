"""Where each recorded random op stands in its generator's stream.

Recording never draws from a generator (kernels run on meta). Each random op is
given a position in a *stream* (one per generator), and each stream is cut into
*epochs*: an epoch starts with a snapshot of the generator's real state and
continues while that state is unchanged. If user code moves the generator
between recorded ops (``torch.manual_seed``, an eager ``torch.randn``), the
next op starts a new epoch from the new state, which is what eager code sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Epoch", "RngRecorder", "Stream", "default_generator"]


@dataclass(slots=True, eq=False)
class Epoch:
    """A run of random ops that start from one generator state."""

    # A ByteTensor from ``Generator.get_state()``, or ``("seed", s)`` for a
    # default CUDA generator on a host without CUDA (seeded by manual_seed).
    state: Any
    calls: list[Any] = field(default_factory=list)  # the random Nodes, in order


@dataclass(slots=True, eq=False)
class Stream:
    """The random ops of one generator (a default one, or a user's)."""

    device: torch.device
    generator: torch.Generator | None  # None: the default generator of `device`
    epochs: list[Epoch] = field(default_factory=list)
    last_state: Any = None

    def __repr__(self) -> str:
        who = "default" if self.generator is None else f"Generator@{id(self.generator):x}"
        return f"Stream({who} on {self.device})"


def default_generator(device: torch.device) -> torch.Generator | None:
    """The default generator of ``device``, or None if this host has none."""
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.default_generators[device.index or 0]
    return None


def _current_state(generator: torch.Generator | None) -> Any:
    if generator is None:
        return ("seed", torch.initial_seed())
    return generator.get_state()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def _freshly_seeded(generator: torch.Generator | None, state: Any) -> bool:
    """Whether ``state`` is what ``manual_seed(initial_seed())`` leaves behind."""
    if generator is None:  # ("seed", s): it only changes by reseeding
        return True
    fresh = torch.Generator(device=generator.device)
    fresh.manual_seed(generator.initial_seed())
    return _same(fresh.get_state(), state)


def _moved_error(node: Any, stream: Stream) -> RuntimeError:
    from torchdefer.recorder.errors import RecordingError

    return RecordingError(
        f"{node.op} at {node.where()} draws from {stream}, which moved since the "
        "last recorded random op in a way other than reseeding (an eager random draw, "
        "or set_rng_state). Eager code would have drawn from a generator advanced by "
        "the recorded draws too; deferred draws do not advance it, so this op's values "
        "would differ from eager. Call torch.manual_seed(...) before this op, or draw "
        "the eager numbers from a separate torch.Generator."
    )


class RngRecorder:
    """Assigns stream positions to random ops as they are recorded."""

    def __init__(self) -> None:
        self.streams: dict[Any, Stream] = {}
        # CPU state when recording began: the start for streams replayed on the
        # CPU that were recorded for a device of another type.
        self.cpu_start = torch.default_generator.get_state()

    def place(self, node: Any, generator: torch.Generator | None, device: torch.device) -> None:
        """Give ``node`` its ``(stream, epoch, position)``."""
        if generator is not None:
            key: Any = ("explicit", id(generator))
            real = generator
            device = generator.device
        else:
            key = ("default", device.type, device.index or 0)
            real = default_generator(device)
        stream = self.streams.get(key)
        if stream is None:
            stream = self.streams[key] = Stream(device, generator)
        state = _current_state(real)
        if not stream.epochs or not _same(state, stream.last_state):
            if stream.epochs and stream.epochs[-1].calls and not _freshly_seeded(real, state):
                raise _moved_error(node, stream)
            stream.epochs.append(Epoch(state))
            stream.last_state = state
        epoch = stream.epochs[-1]
        node.rng = (stream, len(stream.epochs) - 1, len(epoch.calls))
        epoch.calls.append(node)
