"""Exact generator states for logical positions, reached without drawing the gap.

``RngStates.state_at(epoch, model, position)`` gives the state a generator has
at ``position``: from the nearest state already known at or before it (the
epoch's base, or one a replay left behind), the engine jumps ahead
(``rng.mt19937.advance``; a Philox offset is just added) and the cached normal
sample is set as the position says. A cached sample that some earlier call
left is re-created by drawing one float64 normal at the word its pair
started, which is exactly what that call did. An anchor that is the end of a
call the model cannot count is reached by running that call (the runner
``torchdefer.materialize`` installs as ``_hooks.CALL_RUNNER``: it owns
replay, and this package imports it not).

Known states are kept per epoch (a bounded number), so a tensor materialized
after its neighbour starts where the neighbour's draws ended. Replays on
several threads (``materialize_module(threads=N)``) share them: one re-entrant
lock guards the layouts and the known states, and is let go while a jump is
computed, so the threads' jumps run side by side.

Replayed on the other kind of device than recorded (a CPU recording
materialized with ``device="cuda"``, or the reverse), a stream gives the values
the same code gives run on that device from the same seed: each epoch starts
from the replay device's generator as eager code there would find it
(:meth:`RngStates.cross_base`): the first epoch from that generator's state
when recording began, an epoch begun by ``torch.manual_seed(s)`` from that
generator seeded with ``s``, a restored state read in the recording (a marker,
or ``torch.get_rng_state()`` as ``fork_rng`` reads it) from the same call
boundary, as ``fork_rng``, which restores every device, gives (a
:class:`CrossDeviceRestoreWarning` says so: a ``torch.set_rng_state`` of the
CPU alone would not have moved CUDA's generator), and an epoch begun
by any other state user code set (which eager code would have set on the
recorded device only) where the epoch before it ended. A recording that draws
on both kinds of device and is materialized on one gives each stream its own
start (eager code on one device would have interleaved their draws).
"""

from __future__ import annotations

import bisect
import threading
import warnings
from typing import Any

import torch

from torchdefer._hooks import CALL_RUNNER
from torchdefer.errors import InternalError
from torchdefer.rng import _cached_normal, mt19937, philox
from torchdefer.rng._stream import (
    ANCHOR,
    CallReader,
    Epoch,
    Layout,
    Model,
    Position,
    advance,
    call_effect,
    kind_of,
)
from torchdefer.rng.draws import Effect

__all__ = ["CrossDeviceRestoreWarning", "RngStates"]

_KEEP = 64  # known states kept per (epoch, model, anchor) besides the anchor's own
# A known state: (words, cache key, position, state), sorted by the first two.
_Entry = tuple[int, int, Position, torch.Tensor]

def _run_call(node: Any, state: torch.Tensor, model: Model) -> torch.Tensor:
    # torchdefer.materialize installs its replay (_hooks.CALL_RUNNER).
    return CALL_RUNNER.get()(node, state, model)


class RngStates:
    """Exact states of the positions of one recording's streams, with a cache."""

    def __init__(
        self,
        reader: CallReader,
        cpu_start: torch.Tensor,
        start_seed: int | None = None,
        cuda_start: dict[int, torch.Tensor] | None = None,
    ) -> None:
        self.reader = reader  # how the calls' arguments are read (rng.stream.CallReader)
        # The generators when recording began: where a stream replayed on the
        # other kind of device starts. CUDA states only where CUDA was
        # initialized (else a CUDA generator is still at (its seed, 0)).
        self.cpu_start = cpu_start
        self.start_seed = mt19937_seed(cpu_start) if start_seed is None else start_seed
        self.cuda_start = dict(cuda_start or {})
        # (id(epoch), model, anchor) -> sorted [(words, cache key, position, state)]
        self._known: dict[tuple[int, Model, int], list[_Entry]] = {}
        self._epochs: dict[int, Epoch] = {}  # keeps ids above valid
        # Guards the layouts and the known states. Re-entrant: reaching an anchor
        # runs a call, whose replay asks for states again on the same thread.
        self._lock = threading.RLock()

    # ------------------------------------------------------------ layouts

    def layout(self, stream: Any, epoch: Epoch, model: Model) -> Layout:
        """``epoch``'s positions for ``model``, computed from its calls when first asked."""
        with self._lock:
            return self._layout(stream, epoch, model)

    def _layout(self, stream: Any, epoch: Epoch, model: Model) -> Layout:
        layout = epoch.layouts.get(model)
        if layout is None:
            layout = epoch.layouts[model] = Layout()
            layout.anchor_cache = self._base_cache(stream, epoch, model)
        # Calls recorded after this layout was computed (a replay during the
        # recording asked for it): only the recorded device's layout is
        # extended as calls are placed.
        for node in epoch.calls[len(layout.starts) :]:
            self.append(stream, epoch, model, node)
        return layout

    def append(self, stream: Any, epoch: Epoch, model: Model, node: Any) -> Position:
        """Place ``node`` at the end of ``epoch``'s layout for ``model``; its start."""
        with self._lock:
            return self._append(stream, epoch, model, node)

    def _append(self, stream: Any, epoch: Epoch, model: Model, node: Any) -> Position:
        layout = epoch.layouts[model]
        start = layout.end
        layout.starts.append(start)
        effect = call_effect(node, model, self.reader)
        after = advance(start, effect, layout.anchor_cache)
        if after is None and _cache_asked(effect, start, layout, model):
            # Cached normals after a call whose end was learnt, not counted (a
            # stepped rejection loop): whether its end holds a cached sample is
            # read from that end, rather than running this call too.
            anchor = self.state_at(stream, epoch, model, Position(start.anchor, 0))
            layout.anchor_cache = mt19937.cache_valid(anchor)
            after = advance(start, effect, layout.anchor_cache)
        if after is None:  # not countable: the end of this call is the new anchor
            after = Position(len(layout.starts) - 1, 0)
            layout.anchor_cache = None
        layout.end = after
        return start

    def _base_cache(self, stream: Any, epoch: Epoch, model: Model) -> bool | None:
        if model != "cpu":
            return False
        base = epoch.base
        if isinstance(base, tuple) and len(base) == 3:
            return None  # a restored position: known once resolved
        if stream.device.type == "cpu":
            return mt19937.cache_valid(base)
        how = self.cross_base(stream, epoch)[0]
        return {"start": mt19937.cache_valid(self.cpu_start), "seed": False}.get(how)

    def cross_base(self, stream: Any, epoch: Epoch) -> tuple[str, int | None]:
        """Where ``epoch`` starts on the other kind of generator than ``stream``'s.

        ``("start", None)``: that generator as recording began; ``("seed", s)``:
        seeded with ``s``; ``("continue", None)``: where the epoch before ended.
        """
        seed = _fresh_seed(epoch.base)
        first = stream.epochs[0] is epoch
        # A user's generator has no "state when recording began" on the other
        # device: its seed is what the same code would give a generator there.
        own = stream.generator is not None
        if seed is not None and (own or not (first and seed == self.start_seed)):
            return "seed", seed
        return ("start", None) if first else ("continue", None)

    # ------------------------------------------------------------- states

    def start_of(self, node: Any, model: Model) -> torch.Tensor:
        place = node.rng
        stream = place.stream
        epoch = stream.epochs[place.epoch]
        return self.state_at(stream, epoch, model,
                             self.layout(stream, epoch, model).starts[place.index])

    def end_of(self, stream: Any, epoch: Epoch, model: Model) -> torch.Tensor:
        return self.state_at(stream, epoch, model, self.layout(stream, epoch, model).end)

    def after_call(self, node: Any, model: Model) -> Position:
        place = node.rng
        stream, i = place.stream, place.index
        layout = self.layout(stream, stream.epochs[place.epoch], model)
        return layout.starts[i + 1] if i + 1 < len(layout.starts) else layout.end

    def remember(
        self, stream: Any, epoch: Epoch, model: Model, position: Position, state: torch.Tensor
    ) -> None:
        """A state a replay reached for real; a different known one means a wrong model."""
        with self._lock:
            self._remember(stream, epoch, model, position, state)

    def _remember(
        self, stream: Any, epoch: Epoch, model: Model, position: Position, state: torch.Tensor
    ) -> None:
        key = (id(epoch), model, position.anchor)
        self._epochs[id(epoch)] = epoch
        entries = self._known.setdefault(key, [])
        i, hit = _index(entries, position)
        if hit:
            if not _same_state(entries[i][3], state):
                raise InternalError(
                    f"torchdefer's draw model is wrong for a random op of {stream} on this "
                    f"torch {torch.__version__}: the generator state replay reached differs "
                    "from the one computed. Please report this; set the environment variable "
                    "TORCHDEFER_RNG_JUMPS=0 to replay every random op in order instead."
                )
            return
        entries.insert(i, (position.words, _cache_key(position), position, state))
        if len(entries) > _KEEP:
            del entries[len(entries) // 2]  # keep the earliest and the latest

    def state_at(self, stream: Any, epoch: Epoch, model: Model, position: Position) -> torch.Tensor:
        key = (id(epoch), model, position.anchor)
        with self._lock:
            entries = self._known.get(key)
            if not entries:
                anchor_state = self._anchor_state(stream, epoch, model, position.anchor)
                self._remember(stream, epoch, model, Position(position.anchor, 0), anchor_state)
                entries = self._known[key]
            found = self._exact(entries, position)
            if found is not None:
                return found
            known = list(entries)  # another thread may add to the list while we jump
        state = self._reach(known, position, model)
        self.remember(stream, epoch, model, position, state)
        return state

    def _exact(self, entries: list[_Entry], position: Position) -> torch.Tensor | None:
        i, hit = _index(entries, position)
        return entries[i][3] if hit else None

    def _reach(self, entries: list[_Entry], position: Position, model: Model) -> torch.Tensor:
        if model != "cpu":
            _, _, known, state = entries[0]
            offset = philox.offset_of(state)[1] + position.words - known.words
            return philox.with_offset(state, offset)
        target = position.cache
        words = target if isinstance(target, int) else position.words
        # The latest known state not past `words` that keeps the cache right.
        for _, _, known, state in reversed(entries):
            if isinstance(target, int) and known.cache == target and known.words <= position.words:
                return mt19937.advance(state, position.words - known.words)
            if known.words > words or (target == ANCHOR and known.cache != ANCHOR):
                continue
            break
        else:
            raise InternalError("no known generator state before a position; this is a bug "
                                "in torchdefer, please report it")
        state = mt19937.advance(state, words - known.words)
        if target == ANCHOR:
            return state
        state = _cached_normal.without_cache(state)
        if target is None:
            return state
        # The call that left this sample drew its last pair at word `target`.
        state = _cached_normal.one_normal(state)
        return mt19937.advance(state, position.words - target - 4)

    def _anchor_state(self, stream: Any, epoch: Epoch, model: Model, anchor: int) -> torch.Tensor:
        if anchor >= 0:
            node = epoch.calls[anchor]
            starts = self.layout(stream, epoch, model).starts
            return _run_call(node, self.state_at(stream, epoch, model, starts[anchor]), model)
        base = epoch.base
        if isinstance(base, tuple) and len(base) == 3:  # a restored (stream, epoch, position)
            if kind_of(model) != stream.device.type:
                _warn_cross_restore(stream, epoch, model)
            return self._restored_state(base, model)
        if isinstance(base, torch.Tensor) and stream.device.type == kind_of(model):
            return base  # another device of the same kind: positions differ, the base not
        if epoch.origin is not None:  # a state read in this recording, restored
            _warn_cross_restore(stream, epoch, model)
            return self._restored_state(epoch.origin, model)
        how, seed = self.cross_base(stream, epoch)
        if how == "seed":
            return _seeded(model, seed)  # type: ignore[arg-type]
        if how == "start":
            if isinstance(model, str):  # "cpu", the only string
                return self.cpu_start
            return self.cuda_start.get(model.index, philox.state(self.start_seed))
        previous = stream.epochs[stream.epochs.index(epoch) - 1]
        return self.end_of(stream, previous, model)

    def _restored_state(self, ref: tuple[Any, Epoch, Position], model: Model) -> torch.Tensor:
        """The state at a restored position, in ``model``'s layout of the same epoch.

        Markers and synced states stand for a position of their stream's own
        layout, at a boundary between calls; another model's layout has the
        same boundary at the same call index.
        """
        origin, restored, position = ref
        if model != origin.model:
            own = self.layout(origin, restored, origin.model)
            boundaries = [*own.starts, own.end]
            if position not in boundaries:
                raise InternalError("a restored generator position is not a call boundary; "
                                    "this is a bug in torchdefer, please report it")
            other = self.layout(origin, restored, model)
            position = [*other.starts, other.end][boundaries.index(position)]
        return self.state_at(origin, restored, model, position)


def _cache_asked(effect: Any, start: Position, layout: Layout, model: Model) -> bool:
    """Whether a countable call failed only for not knowing the anchor's cached sample."""
    return (model == "cpu" and isinstance(effect, Effect) and effect.normals > 0
            and start.cache == ANCHOR and layout.anchor_cache is None and start.anchor >= 0)


class CrossDeviceRestoreWarning(UserWarning):
    """A recording restored a generator state, and is materialized on another kind of device."""


def _warn_cross_restore(stream: Any, epoch: Epoch, model: Model) -> None:
    first = epoch.calls[0] if epoch.calls else None
    where = f" (the first draw after it: {first.name} at {first.where()})" if first else ""
    warnings.warn(
        f"The code recorded on {stream.device.type} restored its generator's state{where}; "
        f"materialized on {model}, the restore is applied to that device's generator "
        "too, as torch.random.fork_rng (which restores every device) would. Code that "
        f"restores only the {stream.device.type} generator (torch.set_rng_state, "
        "torch.cuda.set_rng_state) would have left the other one running: materialize "
        "on the recorded device for those values.",
        CrossDeviceRestoreWarning,
        stacklevel=2,
    )


def mt19937_seed(state: torch.Tensor) -> int:
    """The seed a CPU generator state was seeded with (``the_initial_seed``)."""
    return int(state[:8].view(torch.int64).item()) & ((1 << 64) - 1)


def _fresh_seed(base: Any) -> int | None:
    """The seed of a generator state as ``manual_seed`` leaves it; None for any other state."""
    if isinstance(base, tuple):
        return base[1] if base and base[0] == "seed" else None
    if base.numel() == philox.STATE_BYTES:
        seed, offset = philox.offset_of(base)
        return seed if offset == 0 else None
    if mt19937.fresh(base):
        return mt19937_seed(base)
    return None


def _seeded(model: Model, seed: int) -> torch.Tensor:
    if model == "cpu":
        generator = torch.Generator()
        generator.manual_seed(seed)
        return generator.get_state()
    return philox.state(seed)


def _cache_key(position: Position) -> int:
    cache = position.cache
    return -2 if cache == ANCHOR else -1 if cache is None else cache


def _index(entries: list[_Entry], position: Position) -> tuple[int, bool]:
    """Where ``position`` sits among sorted ``entries``, and whether it is there."""
    sought = (position.words, _cache_key(position))
    i = bisect.bisect_left(entries, sought, key=lambda e: e[:2])
    return i, i < len(entries) and entries[i][:2] == sought


def _same_state(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)
