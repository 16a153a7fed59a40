"""Streams of random ops and their logical positions in a generator's stream.

One :class:`Stream` per generator (a device's default one, or a user's). A
stream is cut into :class:`Epoch` s: an epoch starts from a *base* (the
generator's real state, a fresh seed, or a position in an earlier epoch that
user code restored) and lists the random calls made from it. Each call starts
at a :class:`Position`: how far past an *anchor* the generator is. The anchor
is the epoch's base, or the end of the last call whose draws the model cannot
count (see ``torchdefer.rng.draws``); such a call must run before anything
after it can be placed exactly.

A call is anything with the few fields :class:`RandomCall` names (the
recorder's ``Node`` is one); what its arguments are, rng asks a
:class:`CallReader` the recorder gives it, so this package imports neither
``recorder`` nor ``materialize``.

Positions are counted per *model* of generator (:func:`model_of`): ``"cpu"``
(mt19937: 32-bit words plus the cached normal sample) or a CUDA device
(Philox offset, whose increments depend on the launch grid of the device the
op runs on: ``torch.device("cuda", i)``). A stream recorded on one device and
replayed on another gets the other model's layout, computed from the recorded
calls when first needed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from torchdefer import _compat
from torchdefer.rng import cuda_increments, draws, philox
from torchdefer.rng.draws import Effect, TensorInfo

__all__ = [
    "ANCHOR",
    "CallReader",
    "Epoch",
    "Layout",
    "Model",
    "Placement",
    "Position",
    "RandomCall",
    "Stream",
    "advance",
    "call_effect",
    "kind_of",
    "model_of",
    "plain_cpu_effect",
]

# The cached-normal state of a Position: None (none cached), ANCHOR (whatever
# the anchor's state had), or an int w: the second normal of the pair drawn
# at word w past the anchor.
ANCHOR = "anchor"

# A model of generator (model_of): "cpu", or the CUDA device whose launch grid
# sets the Philox increments.
Model = str | torch.device


class RandomCall(Protocol):
    """What the RNG accounting needs of one recorded random call (``recorder.Node`` is one)."""

    op: Any  # an OpOverload, or a composite (a Python function; ``steps`` maybe)
    rng: Placement | None  # its place in its stream, given by RngLedger.place

    @property
    def name(self) -> str: ...

    def where(self) -> str: ...


@dataclass(frozen=True, slots=True)
class CallReader:
    """How rng reads a call's arguments: given by whoever records the calls.

    ``describe(call)``: ``(args, kwargs, drawn)`` with every tensor as a
    :class:`~torchdefer.rng.draws.TensorInfo` (``drawn``: the tensor it draws
    into, or None). ``signature(call)``: a hashable key of everything
    ``describe`` would show the draw model (the generator's identity aside),
    or None; calls with equal keys draw alike.
    """

    describe: Callable[[Any], tuple[tuple[Any, ...], dict[str, Any], TensorInfo | None]]
    signature: Callable[[Any], tuple[Any, ...] | None]


@dataclass(frozen=True, slots=True)
class Position:
    """A logical generator state: ``words`` past the anchor, and the normal cache."""

    anchor: int  # -1: the epoch's base; k: the end of call k of the epoch
    words: int
    cache: Any = ANCHOR


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a random call draws: call ``index`` of epoch ``epoch`` of ``stream``
    (what ``RngLedger.place`` gives it, as its ``rng``)."""

    stream: Stream
    epoch: int
    index: int


def advance(
    position: Position, effect: Effect | int | None, anchor_cache: bool | None
) -> Position | None:
    """The position after a call with ``effect`` (words for Philox); None if not countable.

    ``anchor_cache`` says whether the anchor's state holds a cached normal
    (None: unknown, as after a call the model cannot count).
    """
    if effect is None:
        return None
    if isinstance(effect, int):
        return Position(position.anchor, position.words + effect)
    words, cache = position.words, position.cache
    if effect.normals:
        cached = anchor_cache if cache == ANCHOR else cache is not None
        if cached is None:
            return None
        remaining = effect.normals - (1 if cached else 0)
        pairs = (remaining + 1) // 2
        cache = words + 4 * (pairs - 1) if remaining % 2 else None
        words += 4 * pairs
        if not remaining:
            cache = None
    return Position(position.anchor, words + effect.words, cache)


@dataclass(slots=True, eq=False)
class Layout:
    """Where each call of an epoch starts, for one model of generator."""

    starts: list[Position] = field(default_factory=list)
    end: Position = field(default_factory=lambda: Position(-1, 0))
    # Whether the current anchor's state holds a cached normal (None: unknown).
    anchor_cache: bool | None = None


@dataclass(slots=True, eq=False)
class Epoch:
    """Random calls made from one base, in order."""

    # A state tensor of the stream's generator; ("seed", s): a generator
    # freshly seeded with s; or (Stream, Epoch, Position): a logical position
    # whose marker user code restored (it may come from another generator).
    base: Any
    calls: list[Any] = field(default_factory=list)  # the random Nodes
    layouts: dict[Model, Layout] = field(default_factory=dict)
    # (Stream, Epoch, Position in that stream's own layout) a state-tensor base
    # stands for, where a sync of this recording left it (fork_rng reads and
    # restores such states): the same position on another kind of device.
    origin: Any = None


@dataclass(slots=True, eq=False)
class Stream:
    """The random calls of one generator."""

    device: torch.device
    generator: torch.Generator | None  # None: the default generator of `device`
    model: Model | None  # model_of(device) when a real generator exists here, else None
    epochs: list[Epoch] = field(default_factory=list)
    # The state this process's generator was left in by the recorder (a
    # synced state or a marker); anything else means user code changed it.
    left: torch.Tensor | None = None
    # The first two array words of `left` if it is a marker (what tells it
    # apart, rng.ledger); None if `left` is an exact state.
    left_key: bytes | None = None
    seed_seen: int | None = None  # default CUDA generator on a host without CUDA

    def __repr__(self) -> str:
        who = "default" if self.generator is None else f"Generator@{id(self.generator):x}"
        return f"Stream({who} on {self.device})"


def model_of(device: torch.device) -> Model | None:
    """The generator model that counts positions for ops running on ``device``.

    ``"cpu"`` for the CPU; the normalized device itself for CUDA, because a
    Philox increment depends on that device's properties. Other devices: None.
    """
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        index = device.index
        if index is None:
            index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return torch.device("cuda", index)
    return None


def kind_of(model: Model | None) -> str | None:
    """``"cpu"`` or ``"cuda"``: the kind of generator a model counts for."""
    if model is None:
        return None
    return "cpu" if model == "cpu" else "cuda"


def call_effect(
    call: Any, model: Model | None, reader: CallReader
) -> draws.Effect | int | None:
    """What ``call`` does to a generator of ``model``: an Effect (CPU), words (Philox), None."""
    func = call.op
    if not hasattr(func, "_schema"):  # a composite node (a Python function)
        return None
    if isinstance(model, str):  # "cpu", the only string
        return _cpu_effect(call, func, reader)
    if model is None:  # a device without a generator model: run the call
        return None
    args, kwargs, drawn = reader.describe(call)
    if drawn is None:
        return None
    return cuda_increments.increment(func, args, kwargs, drawn, philox.DeviceShape.of(model))


# CPU effects by call signature. A model's thousands of random ops repeat a
# few signatures (its layers share shapes), and the draw model's answer is a
# function of the op, the metadata of its tensors and its other arguments,
# and TORCHDEFER_RNG_JUMPS; asking it costs ~20 µs a call, a lookup ~2.
_effects: dict[tuple[Any, ...], draws.Effect | None] = {}
_EFFECTS_KEPT = 4096
_MISSING = object()


def _jumps_setting() -> Any:
    """TORCHDEFER_RNG_JUMPS as set now (encoded), read for every random call.

    ``os.environ.get`` of an unset name raises and catches a KeyError inside
    (~2 µs, ~7% of a recorded ``normal_``); the mapping it wraps answers in
    ~0.1. Any change made through ``os.environ`` is seen at once, as before.
    """
    return _ENV_DATA.get(_JUMPS_KEY)


try:  # os._Environ's own mapping of encoded names to encoded values
    _ENV_DATA: Any = os.environ._data  # type: ignore[attr-defined]
    _JUMPS_KEY: Any = os.environ.encodekey("TORCHDEFER_RNG_JUMPS")
except AttributeError:  # another Python's environ: ask it
    _ENV_DATA, _JUMPS_KEY = os.environ, "TORCHDEFER_RNG_JUMPS"


def _cpu_effect(call: Any, func: Any, reader: CallReader) -> draws.Effect | None:
    signature = reader.signature(call)
    key = None if signature is None else (_jumps_setting(), signature)
    known = _effects.get(key, _MISSING) if key is not None else _MISSING
    if known is not _MISSING:
        return known  # type: ignore[return-value]  # not _MISSING: an Effect or None
    args, kwargs, drawn = reader.describe(call)
    effect = None if drawn is None else draws.effect(func, args, kwargs, drawn)
    if key is not None:
        if len(_effects) >= _EFFECTS_KEPT:
            _effects.clear()
        _effects[key] = effect
    return effect


# Effects of the plainest calls by a key their recorder gives (see
# plain_cpu_effect): flat, and without the OpOverload's Python __hash__, it
# costs a fraction of building and hashing a call's signature.
_plain_effects: dict[tuple[Any, ...], tuple[Any, Any, draws.Effect | None]] = {}


def plain_cpu_effect(call: Any, key: tuple[Any, ...], reader: CallReader) -> draws.Effect | None:
    """:func:`call_effect` on the CPU for a call its recorder describes wholly by ``key``.

    ``key`` must tell apart everything ``reader.signature(call)`` does (calls
    with equal keys draw alike) and start with ``id(call.op)``; the op itself
    is kept with the answer and compared, so a reused id never matches, and
    so is TORCHDEFER_RNG_JUMPS as set when the answer was computed.
    """
    jumps = _ENV_DATA.get(_JUMPS_KEY)  # _jumps_setting(), inline: once per random op
    known = _plain_effects.get(key)
    if known is not None and known[0] is call.op and known[1] == jumps:
        return known[2]
    with _compat.DisableTorchDispatch():  # the draw model may run probe kernels
        effect = _cpu_effect(call, call.op, reader)
    if len(_plain_effects) >= _EFFECTS_KEPT:
        _plain_effects.clear()
    _plain_effects[key] = (call.op, jumps, effect)
    return effect
