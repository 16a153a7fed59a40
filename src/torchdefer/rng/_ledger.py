"""Which random call drew where, for every generator a recording touched.

:class:`RngLedger` gives each random call its place in its generator's stream
(``rng._stream``: the stream, the epoch, the index) and keeps the real
generator where eager code would have left it, without drawing: a state is
computed by jump-ahead (``rng._states``), or, while that would cost too much,
a *marker* stands in for it.

A marker is a unique CPU state standing for "the logical position after call
k" (~20 us to set, where a jump costs ~10-50 ms). It must never reach user
code: the caller says, per call, whether one may be left (``lazy``: only
while every read of a generator's state is seen, and no other thread can
draw), and calls :meth:`RngLedger.sync` before any read, which puts the
exact state in, remembered so that a later ``set_state`` of it is known as
its position. Any other change of a generator's state (``manual_seed``,
``set_rng_state``) starts a new epoch from it.

CUDA generators (Philox) are moved at once (an addition). A default CUDA
generator on a host without CUDA does not exist: its stream starts from its
seed and is replayed on the CPU.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import torch

from torchdefer import _compat
from torchdefer._compat.generator import generator_id, get_state
from torchdefer.errors import UnsupportedError
from torchdefer.rng import mt19937
from torchdefer.rng._gf2 import tensor_bytes
from torchdefer.rng._states import RngStates
from torchdefer.rng._stream import (
    CallReader,
    Epoch,
    Placement,
    Position,
    Stream,
    advance,
    model_of,
    plain_cpu_effect,
)

__all__ = ["RngLedger", "default_generator"]

_KEY_AT = mt19937.ARRAY.start  # byte offset of the array's first word
_KEY_BYTES = 16  # two int64 words: the count, a random word
_COUNT = struct.Struct("=q")  # the first word, as the state holds it (native int64)


def _key(state: torch.Tensor) -> bytes:
    """What tells markers apart: the first two words of the array, read in place.

    ``state`` is a ``get_state()`` result or a clone of one: a contiguous CPU
    byte tensor of ``mt19937.STATE_BYTES`` (a CUDA state is never asked).
    """
    # string_at, not a ctypes array's from_address: that makes an object the
    # cyclic GC tracks, once per random op (GC time ~10x what it saves).
    return ctypes.string_at(state.data_ptr() + _KEY_AT, _KEY_BYTES)


def default_generator(device: torch.device) -> torch.Generator | None:
    """The default generator of ``device``, or None if this host has none."""
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device() if device.index is None else device.index
        if index < torch.cuda.device_count():  # cuda:1 on a one-GPU host has none
            # torch.cuda.default_generators stays () until CUDA is initialized:
            # a first draw on "cuda:0" in a fresh process found none. Eager's
            # first draw there initializes CUDA too.
            generators = torch.cuda.default_generators
            if not generators:
                torch.cuda.init()
                generators = torch.cuda.default_generators
            if index < len(generators):
                return generators[index]
    return None


def cuda_states() -> dict[int, torch.Tensor]:
    """The CUDA generators' states where CUDA is initialized (never initializes it)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    return {i: get_state(g) for i, g in enumerate(torch.cuda.default_generators)}


class RngLedger:
    """Places random calls in their streams and keeps the real generators in step."""

    def __init__(self, reader: CallReader, cpu_start: torch.Tensor,
                 cuda_start: dict[int, torch.Tensor]) -> None:
        self.streams: dict[Any, Stream] = {}
        # CPU state when recording began: where streams recorded for a device
        # of another type start when replayed on the CPU.
        self.cpu_start = cpu_start
        self.states = RngStates(reader, cpu_start, torch.initial_seed(), cuda_start)
        # marker key -> (stream, epoch, position) it stands for
        self._markers: dict[bytes, tuple[Stream, Epoch, Position]] = {}
        # exact state (bytes) a sync left in a generator -> the position it stands for
        self._exact: dict[bytes, tuple[Stream, Epoch, Position]] = {}
        self._marker_count = 0
        # id(stream) -> (its marker tensor, a ctypes view of the marker's count
        # word): writing a new count costs ~0.03 µs through it, ~0.5 through a
        # new from_address. The tensor is kept so that the view's memory lives.
        self._count_words: dict[int, tuple[torch.Tensor, ctypes.c_int64]] = {}
        # device -> its default generator's stream: one dict lookup, where the
        # key tuple of _stream costs ~0.5 µs (cpu and cpu:0 are two entries).
        self._default_streams: dict[torch.device, Stream] = {}

    def unknown_generator(self, device: torch.device) -> Exception:
        """The error for a random call on a device whose generator has no model here."""
        return UnsupportedError(
            f"A random op draws from the {device.type} generator, which torchdefer "
            "cannot position (it knows the CPU and CUDA generators). Draw on the CPU "
            "or CUDA, or create this tensor after materialization."
        )

    # ----------------------------------------------------------- placing

    def place(self, call: Any, generator: torch.Generator | None, device: torch.device,
              lazy: bool) -> None:
        """Give ``call`` its ``(stream, epoch, index)`` and move the real generator past it.

        ``lazy``: a marker may stand in the generator afterwards (see the module).
        """
        # The generator states and the tensors below are real: no mode may see
        # them, and they are kept across inference-mode blocks (written later,
        # maybe outside one: never inference tensors).
        if torch.is_inference_mode_enabled():
            with torch.inference_mode(False):
                return self._place(call, generator, device, lazy)
        return self._place(call, generator, device, lazy)

    def _place(self, call: Any, generator: torch.Generator | None, device: torch.device,
               lazy: bool) -> None:
        with _compat.DisableTorchDispatch():
            stream = self._stream(generator, device)
            real: torch.Generator | None
            if generator is not None:
                real = generator
            elif stream.model == "cpu":  # default_generator(stream.device), one call fewer
                real = torch.default_generator
            else:
                real = default_generator(stream.device)
            current = None if real is None else get_state(real)
            same = current is not None and self._holds_left(stream, current)
            epoch = self._epoch(stream, current, same)
            model = stream.model
            call.rng = Placement(stream, len(stream.epochs) - 1, len(epoch.calls))
            epoch.calls.append(call)
            if model is not None:  # the layout places the calls it has not yet
                self.states.layout(stream, epoch, model)
            if real is None or current is None:  # both or neither
                return
            if lazy and model == "cpu":
                self._leave_marker(stream, epoch, real, current, same)
            else:
                self._sync(stream, epoch, real)

    def try_place_plain(self, call: Any, device: torch.device, key: tuple[Any, ...]) -> bool:
        """:meth:`place` of the commonest call, with ``lazy``; False (nothing done) if not it.

        The commonest call (nearly every random op of a model's ``__init__``)
        draws from ``device``'s default CPU generator, which still holds the
        marker this ledger left after the call before, in an epoch whose
        layout is current, and its draws are counted by the model. Then its
        place is the layout's end and the marker's count moves on, as
        :meth:`place` would do, without the general steps (stream keys, epoch
        checks, the call's signature). ``key`` describes the call wholly
        (:func:`rng._stream.plain_cpu_effect`). Outside inference mode only.
        ``get_state``/``set_state`` reach no dispatch mode (no guard needed).
        """
        stream = self._default_streams.get(device)
        if stream is None or stream.left_key is None or stream.model != "cpu":
            return False
        marker = stream.left  # the marker tensor (left_key says it is one)
        if marker is None:
            return False
        epoch = stream.epochs[-1]
        layout = epoch.layouts.get("cpu")
        if layout is None or len(layout.starts) != len(epoch.calls):
            return False  # calls placed after a replay computed this layout: the general path
        start = layout.end
        after = advance(start, plain_cpu_effect(call, key, self.states.reader), layout.anchor_cache)
        if after is None:  # an anchor, or a cached normal to read: the general path
            return False
        real = torch.default_generator
        left_key = stream.left_key
        if _key(get_state(real)) != left_key:  # user code set the state: a new epoch
            return False
        call.rng = Placement(stream, len(stream.epochs) - 1, len(epoch.calls))
        epoch.calls.append(call)
        layout.starts.append(start)
        layout.end = after
        # _leave_marker's case of a generator holding the marker left last.
        count = self._count_words.get(id(stream))
        if count is None or count[0] is not marker:
            self._leave_marker(stream, epoch, real, marker, True)
            return True
        self._marker_count += 1
        count[1].value = self._marker_count
        marker_key = _COUNT.pack(self._marker_count) + left_key[_COUNT.size:]
        self._markers[marker_key] = (stream, epoch, after)
        real.set_state(marker)
        stream.left_key = marker_key
        return True

    def _stream(self, generator: torch.Generator | None, device: torch.device) -> Stream:
        if generator is None:
            stream = self._default_streams.get(device)
            if stream is None:
                stream = self._default_streams[device] = self._keyed_stream(None, device)
            return stream
        return self._keyed_stream(generator, device)

    def _keyed_stream(self, generator: torch.Generator | None, device: torch.device) -> Stream:
        if generator is not None:
            # By the C++ generator: the dispatcher hands ops a new Python wrapper of
            # the generator the user passed, so the wrapper identity differs.
            key: Any = ("explicit", generator_id(generator))
        else:
            key = ("default", device.type, device.index or 0)
        stream = self.streams.get(key)
        if stream is None:
            if generator is not None:
                device = generator.device
            real = generator if generator is not None else default_generator(device)
            model = model_of(device) if real is not None else None
            if real is not None and model is None:
                raise self.unknown_generator(device)
            stream = self.streams[key] = Stream(device, generator, model)
        return stream

    def _real(self, stream: Stream) -> torch.Generator | None:
        if stream.generator is not None:
            return stream.generator
        return default_generator(stream.device)

    def _epoch(self, stream: Stream, current: torch.Tensor | None, same: bool) -> Epoch:
        """The epoch the next call belongs to; a new one if user code moved the generator.

        ``same``: ``current`` is the state the ledger left (``stream.left``).
        """
        if current is None:  # a default CUDA generator on a host without CUDA
            seed = torch.initial_seed()
            if not stream.epochs or stream.seed_seen != seed:
                stream.epochs.append(Epoch(("seed", seed)))
                stream.seed_seen = seed
            return stream.epochs[-1]
        if stream.epochs and same:
            return stream.epochs[-1]
        if stream.model == "cpu":
            restored = self._markers.get(_key(current))
            if restored is not None:  # a marker put back (by a bound method taken earlier)
                stream.epochs.append(Epoch(restored))
                return stream.epochs[-1]
        # A state eager code set; maybe one a sync handed out (fork_rng).
        stream.epochs.append(Epoch(current, origin=self._exact.get(tensor_bytes(current))))
        return stream.epochs[-1]

    def _holds_left(self, stream: Stream, current: torch.Tensor) -> bool:
        """Whether the generator still holds the state the ledger left in it.

        A marker is told by its key alone (~1 us, where comparing the 5 KB
        state costs ~10): user code cannot make those two words, since no read
        hands a marker out. An exact state needs the whole comparison.
        """
        if stream.left_key is not None:
            return _key(current) == stream.left_key
        left = stream.left
        return left is not None and left.shape == current.shape and torch.equal(current, left)

    # ----------------------------------------------------------- syncing

    def _leave_marker(
        self,
        stream: Stream,
        epoch: Epoch,
        real: torch.Generator,
        current: torch.Tensor,
        same: bool,
    ) -> None:
        """Put a state standing for ``epoch``'s end in the generator (~10 us, no jump).

        ``same``: the generator holds the marker left last (its fields are current).
        """
        marker = stream.left
        if marker is None or stream.left_key is None:  # the generator holds no marker of ours
            # A new marker tensor for this stream: the real state's seed and
            # fields, random words for the array.
            marker = current.clone()
            source = torch.Generator()
            source.seed()
            words = torch.randint(
                0, 1 << 32, (624,), dtype=torch.int64, device="cpu", generator=source
            )
            mt19937.array_of(marker).copy_(words)
            word = _key(marker)[_COUNT.size:]
        else:
            word = stream.left_key[_COUNT.size:]
            if not same:  # the seed, position fields and cached samples of the real state
                marker[mt19937.ENGINE] = current[mt19937.ENGINE]
                marker[mt19937.CACHES] = current[mt19937.CACHES]
        self._marker_count += 1
        # The count as the array's first word: unique per position.
        count = self._count_words.get(id(stream))
        if count is None or count[0] is not marker:
            count = self._count_words[id(stream)] = (
                marker, ctypes.c_int64.from_address(marker.data_ptr() + _KEY_AT))
        count[1].value = self._marker_count
        key = _COUNT.pack(self._marker_count) + word  # _key(marker), as just written
        layout = epoch.layouts[stream.model]  # type: ignore[index]
        self._markers[key] = (stream, epoch, layout.end)
        real.set_state(marker)
        stream.left, stream.left_key = marker, key

    def _sync(self, stream: Stream, epoch: Epoch, real: torch.Generator) -> None:
        exact = self.states.end_of(stream, epoch, stream.model)  # type: ignore[arg-type]
        real.set_state(exact)
        stream.left, stream.left_key = get_state(real), None
        # A state user code may read and restore (fork_rng): known by its bytes,
        # so a restore of it is the restore of this position on any device.
        end = epoch.layouts[stream.model].end  # type: ignore[index]
        self._exact[tensor_bytes(stream.left)] = (stream, epoch, end)

    def tracks(self, generator: torch.Generator) -> bool:
        """Whether a stream here draws from ``generator`` (the same C++ generator)."""
        wanted = generator_id(generator)
        return any(
            real is not None and generator_id(real) == wanted
            for real in map(self._real, self.streams.values())
        )

    def sync(self, generator: torch.Generator | None = None) -> None:
        """Put the exact state in every generator (or ``generator``) that holds a marker.

        Called before user code reads a state, when a thread starts and when
        a recording ends. The exact state is remembered, so restoring it later
        is known as its position.
        """
        wanted = None if generator is None else generator_id(generator)
        for stream in self.streams.values():
            real = self._real(stream)
            if real is None or stream.model != "cpu":
                continue
            if wanted is not None and generator_id(real) != wanted:
                continue
            ref = self._markers.get(_key(get_state(real)))
            if ref is None:  # an exact state: ours, or one user code set
                continue
            origin, epoch, position = ref
            real.set_state(self.states.state_at(origin, epoch, "cpu", position))
            stream.left, stream.left_key = get_state(real), None
            self._exact[tensor_bytes(stream.left)] = ref
