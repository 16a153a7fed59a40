"""Random ops in their generator's stream, and generators left where eager code leaves them.

Recording never draws (kernels run on meta), yet eager code would have moved
the generator by every draw. So each random op is given its logical position
(``recorder.stream``), and the generator itself is moved to where eager
construction would have left it (``recorder.states`` computes the state by
jump-ahead, without drawing):

* after each recorded random op, when recording outside ``deferred_init``
  (``model.apply(init_fn)`` on a deferred model): at once;
* inside ``deferred_init``: when it returns, and whenever user code reads
  the state (``Generator.get_state`` and every other read: ``_compat.generator``
  intercepts them while a recording runs). In between, the CPU generator
  holds a *marker*: a unique state standing for "the logical position after
  op k", which never leaves torchdefer. A read puts the exact state in the
  generator first, and remembers it, so a later ``set_state`` of it is known
  as that position; any other change of the state (``manual_seed``,
  ``set_rng_state``) starts a new epoch from it. A jump per op would cost
  ~10-50 ms; a marker ~20 us. Where the reads cannot be intercepted, and
  while other threads are alive, no marker is used.

CUDA generators (Philox) are moved at once (an addition). A default CUDA
generator on a host without CUDA does not exist: its stream starts from its
seed and is replayed on the CPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
from collections.abc import Iterator
from typing import Any

import torch

from torchdefer import _compat
from torchdefer._compat.generator import get_state
from torchdefer.recorder._threads import reads_seen, recording_thread
from torchdefer.recorder.errors import RecordingError
from torchdefer.recorder.graph import NodeKind
from torchdefer.recorder.states import RngStates
from torchdefer.recorder.stream import Epoch, Position, Stream, model_of
from torchdefer.rng import mt19937
from torchdefer.rng.gf2 import tensor_bytes

__all__ = ["RngRecorder", "default_generator"]

_KEY_AT = mt19937.ARRAY.start  # byte offset of the array's first word
_KEY_BYTES = 16  # two int64 words
_COUNT = struct.Struct("=q")  # the first word, as array_of's int64 view holds it


def _marker_key(state: torch.Tensor) -> bytes:
    """What tells markers apart: the first two words of the array (a count, a random word)."""
    if _plain_state(state):  # read in place: this runs for every random op
        return ctypes.string_at(state.data_ptr() + _KEY_AT, _KEY_BYTES)
    return tensor_bytes(mt19937.array_of(state)[:2])


def _plain_state(state: torch.Tensor) -> bool:
    """A contiguous CPU byte tensor long enough to hold the marker's words."""
    return (state.dtype == torch.uint8 and state.device.type == "cpu" and state.is_contiguous()
            and state.numel() >= _KEY_AT + _KEY_BYTES)


def _set_count(marker: torch.Tensor, count: int) -> None:
    """Write ``count`` as the array's first word (int64, as ``array_of`` reads it)."""
    if _plain_state(marker):
        ctypes.c_int64.from_address(marker.data_ptr() + _KEY_AT).value = count
    else:
        mt19937.array_of(marker)[0] = count


def _same(left: torch.Tensor | None, current: torch.Tensor) -> bool:
    """Whether the generator's state ``current`` is still the one the recorder left."""
    return left is not None and left.shape == current.shape and torch.equal(current, left)


def default_generator(device: torch.device) -> torch.Generator | None:
    """The default generator of ``device``, or None if this host has none."""
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.default_generators[device.index or 0]
    return None


def _cuda_states() -> dict[int, torch.Tensor]:
    """The CUDA generators' states where CUDA is initialized (never initializes it)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    return {i: get_state(g) for i, g in enumerate(torch.cuda.default_generators)}


class RngRecorder:
    """Assigns stream positions to random ops and keeps the real generators in step."""

    def __init__(self) -> None:
        from torchdefer.recorder.mode import suspended

        self.streams: dict[Any, Stream] = {}
        # The states kept here are written in place later, maybe outside the
        # inference mode a recording began in: never inference tensors.
        with suspended(), torch.inference_mode(False):
            # CPU state when recording began: where streams recorded for a
            # device of another type start when replayed on the CPU.
            self.cpu_start = get_state(torch.default_generator)
            cuda_start = _cuda_states()
        self.states = RngStates(self.cpu_start, torch.initial_seed(), cuda_start)
        self._deferring = 0  # nesting depth of deferred_init blocks
        self._thread: int | None = None
        # marker key -> (stream, epoch, position) it stands for
        self._markers: dict[bytes, tuple[Stream, Epoch, Position]] = {}
        # exact state (bytes) a sync left in a generator -> the position it stands for
        self._exact: dict[bytes, tuple[Stream, Epoch, Position]] = {}
        self._marker_count = 0
        # id(marker tensor) -> (it, its second array word): the markers this
        # recorder made (a stream's `left` is one of them or an exact state).
        self._own: dict[int, tuple[torch.Tensor, bytes]] = {}

    # ----------------------------------------------------------- placing

    def place(self, node: Any, generator: torch.Generator | None, device: torch.device) -> None:
        """Give ``node`` its ``(stream, epoch, index)`` and move the real generator past it.

        On meta nothing is drawn (eager's kernels there touch no generator):
        the node is an ordinary write, replayed as one.
        """
        if device.type == "meta":
            node.kind = NodeKind.INPLACE if node.writes else NodeKind.CALL
            return
        # The generator states and the tensors below are real: no mode may see
        # them, and they are kept across inference-mode blocks (see __init__).
        with _compat.DisableTorchDispatch(), torch.inference_mode(False):
            stream = self._stream(generator, device)
            real = self._real(stream)
            current = None if real is None else get_state(real)
            # Whether the generator still holds what the recorder left in it.
            same = current is not None and _same(stream.left, current)
            epoch = self._epoch(stream, current, same)
            if stream.model is not None:
                self.states.layout(stream, epoch, stream.model)
            node.rng = (stream, len(stream.epochs) - 1, len(epoch.calls))
            epoch.calls.append(node)
            if stream.model is not None:
                self.states.append(stream, epoch, stream.model, node)
            if real is None:
                return
            if self._lazy() and stream.model == "cpu":
                self._leave_marker(stream, epoch, real, current, same)
            else:
                self._sync(stream, epoch, real)

    def _stream(self, generator: torch.Generator | None, device: torch.device) -> Stream:
        if generator is not None:
            # By the C++ generator: the dispatcher hands ops a new Python wrapper of
            # the generator the user passed, so the wrapper identity differs.
            key: Any = ("explicit", generator._cdata)
            device = generator.device
        else:
            key = ("default", device.type, device.index or 0)
        stream = self.streams.get(key)
        if stream is None:
            real = generator if generator is not None else default_generator(device)
            model = model_of(device) if real is not None else None
            if real is not None and model is None:
                raise RecordingError(
                    f"A random op draws from the {device.type} generator, which torchdefer "
                    "cannot position (it knows the CPU and CUDA generators). Draw on the CPU "
                    "or CUDA, or create this tensor after materialization."
                )
            stream = self.streams[key] = Stream(device, generator, model)
        return stream

    def _real(self, stream: Stream) -> torch.Generator | None:
        if stream.generator is not None:
            return stream.generator
        return default_generator(stream.device)

    def _epoch(self, stream: Stream, current: torch.Tensor | None, same: bool) -> Epoch:
        """The epoch the next op belongs to; a new one if user code moved the generator.

        ``same``: ``current`` equals the state the recorder left (``stream.left``).
        """
        if current is None:  # a default CUDA generator on a host without CUDA
            seed = torch.initial_seed()
            if not stream.epochs or stream.seed_seen != seed:
                stream.epochs.append(Epoch(("seed", seed)))
                stream.seed_seen = seed
            return stream.epochs[-1]
        if stream.epochs and same:
            return stream.epochs[-1]
        restored = self._markers.get(_marker_key(current))
        if restored is not None:
            stream.epochs.append(Epoch(restored))
        else:  # a state eager code set; maybe one a sync handed out (fork_rng)
            stream.epochs.append(Epoch(current, origin=self._exact.get(tensor_bytes(current))))
        return stream.epochs[-1]

    # ----------------------------------------------------------- syncing

    def _leave_marker(
        self, stream: Stream, epoch: Epoch, real, current: torch.Tensor, same: bool
    ) -> None:
        """Put a state standing for ``epoch``'s end in the generator (~10 us, no jump).

        ``same``: the generator holds the marker left last (its fields are current).
        """
        marker = stream.left
        own = self._own.get(id(marker)) if marker is not None else None
        if own is None or own[0] is not marker:  # the generator holds no marker of ours
            # A new marker tensor for this stream: the real state's seed and
            # fields, random words for the array.
            marker = current.clone()
            source = torch.Generator()
            source.seed()
            words = torch.randint(
                0, 1 << 32, (624,), dtype=torch.int64, device="cpu", generator=source
            )
            mt19937.array_of(marker).copy_(words)
            own = self._own[id(marker)] = (marker, _marker_key(marker)[_COUNT.size:])
        elif not same:  # the seed, position fields and cached samples of the real state
            marker[mt19937.ENGINE] = current[mt19937.ENGINE]
            marker[mt19937.CACHES] = current[mt19937.CACHES]
        self._marker_count += 1
        _set_count(marker, self._marker_count)  # unique per position
        layout = epoch.layouts[stream.model]  # type: ignore[index]
        # _marker_key(marker), from what was just written
        self._markers[_COUNT.pack(self._marker_count) + own[1]] = (stream, epoch, layout.end)
        real.set_state(marker)
        stream.left = marker

    def _sync(self, stream: Stream, epoch: Epoch, real) -> None:
        exact = self.states.end_of(stream, epoch, stream.model)  # type: ignore[arg-type]
        real.set_state(exact)
        stream.left = get_state(real)
        # A state user code may read and restore (fork_rng): known by its bytes,
        # so a restore of it is the restore of this position on any device. On
        # the CPU too: with other threads alive no marker stands in for it.
        end = epoch.layouts[stream.model].end  # type: ignore[index]
        self._exact[tensor_bytes(stream.left)] = (stream, epoch, end)

    def sync(self, generator: torch.Generator | None = None) -> None:
        """Put the exact logical state in every generator (or ``generator``) holding a marker.

        Called before user code reads a state (``_compat.generator``), when a
        thread starts and when ``deferred_init`` ends. The exact state is
        remembered, so restoring it later in the recording is known as its
        position.
        """
        from torchdefer.recorder.mode import suspended

        wanted = None if generator is None else generator._cdata
        for stream in self.streams.values():
            real = self._real(stream)
            if real is None or stream.model != "cpu":
                continue
            if wanted is not None and real._cdata != wanted:
                continue
            with suspended(), torch.inference_mode(False):
                ref = self._markers.get(_marker_key(get_state(real)))
                if ref is None:  # an exact state: ours, or one user code set
                    continue
                origin, epoch, position = ref
                real.set_state(self.states.state_at(origin, epoch, "cpu", position))
                stream.left = get_state(real)
                self._exact[tensor_bytes(stream.left)] = ref

    def _lazy(self) -> bool:
        """Whether a marker may stand in for the exact state after this op.

        Only while every read of a generator's state is seen (``_compat.generator``)
        and the recording thread is the only Python thread: a marker is
        a state of the process-wide generator, and another thread drawing from
        it would get numbers no eager program gives (nor leave the generator
        where eager would). With other threads alive, every op moves the
        generator to its exact state at once; a thread the recording thread
        starts finds the exact state too (``recorder._threads``).
        """
        return (
            self._deferring > 0
            and threading.get_ident() == self._thread
            and threading.active_count() == 1
            and reads_seen()
        )

    @contextlib.contextmanager
    def deferring(self) -> Iterator[None]:
        """Inside: generators move when read or at the end, not after every op."""
        outer = self._deferring == 0
        if outer:
            self._thread = threading.get_ident()
        self._deferring += 1
        try:
            if outer:
                with recording_thread(self.sync):
                    yield
            else:
                yield
        finally:
            self._deferring -= 1
            if outer:
                self._thread = None
                self.sync()
