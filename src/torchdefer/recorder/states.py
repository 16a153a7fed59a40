"""Exact generator states for logical positions, reached without drawing the gap.

``RngStates.state_at(epoch, model, position)`` gives the state a generator has
at ``position``: from the nearest state already known at or before it (the
epoch's base, or one a replay left behind), the engine jumps ahead
(``rng.mt19937.advance``; a Philox offset is just added) and the cached normal
sample is set as the position says. A cached sample that some earlier call
left is re-created by drawing one float64 normal at the word its pair
started, which is exactly what that call did. An anchor that is the end of a
call the model cannot count is reached by running that call (``run_call``,
injected by ``torchdefer.materialize``, which owns replay).

Known states are kept per epoch (a bounded number), so a tensor materialized
after its neighbour starts where the neighbour's draws ended.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import torch

from torchdefer.recorder.stream import ANCHOR, Epoch, Layout, Position, advance, call_effect
from torchdefer.rng import mt19937, philox

__all__ = ["RngStates", "set_call_runner"]

_KEEP = 64  # known states kept per (epoch, model, anchor) besides the anchor's own

# (node, state, model) -> state after the node; installed by torchdefer.materialize.
_runner: list[Callable[[Any, torch.Tensor, str], torch.Tensor]] = []


def set_call_runner(runner: Callable[[Any, torch.Tensor, str], torch.Tensor]) -> None:
    _runner[:] = [runner]


def _run_call(node: Any, state: torch.Tensor, model: str) -> torch.Tensor:
    if not _runner:
        raise RuntimeError(
            "Placing a random op after one whose draws cannot be counted needs "
            "torchdefer.materialize; import torchdefer (not only torchdefer.recorder)."
        )
    return _runner[0](node, state, model)


def _without_cache(state: torch.Tensor) -> torch.Tensor:
    if not mt19937.cache_valid(state):
        return state
    out = state.clone()
    out[mt19937.NORMAL_Y : mt19937.NORMAL_Y + 8].zero_()
    out[mt19937.NORMAL_VALID : mt19937.NORMAL_VALID + 4].zero_()
    return out


def _one_normal(state: torch.Tensor) -> torch.Tensor:
    """``state`` after one ``at::normal_distribution<double>`` sample (as torch draws it)."""
    generator = torch.Generator()
    generator.set_state(state)
    torch.empty(1, dtype=torch.float64, device="cpu").normal_(generator=generator)
    return generator.get_state()


class RngStates:
    """Exact states of the positions of one recording's streams, with a cache."""

    def __init__(self, cpu_start: torch.Tensor) -> None:
        self.cpu_start = cpu_start
        # (id(epoch), model, anchor) -> sorted [(words, cache key, position, state)]
        self._known: dict[tuple[int, str, int], list[tuple[int, int, Position, Any]]] = {}
        self._epochs: dict[int, Epoch] = {}  # keeps ids above valid

    # ------------------------------------------------------------ layouts

    def layout(self, stream: Any, epoch: Epoch, model: str) -> Layout:
        """``epoch``'s positions for ``model``, computed from its calls when first asked."""
        layout = epoch.layouts.get(model)
        if layout is None:
            layout = epoch.layouts[model] = Layout()
            layout.anchor_cache = self._base_cache(stream, epoch, model)
            for node in epoch.calls:
                self.append(stream, epoch, model, node)
        return layout

    def append(self, stream: Any, epoch: Epoch, model: str, node: Any) -> Position:
        """Place ``node`` at the end of ``epoch``'s layout for ``model``; its start."""
        layout = epoch.layouts[model]
        start = layout.end
        layout.starts.append(start)
        after = advance(start, call_effect(node, model), layout.anchor_cache)
        if after is None:  # not countable: the end of this call is the new anchor
            after = Position(len(layout.starts) - 1, 0)
            layout.anchor_cache = None
        layout.end = after
        return start

    def _base_cache(self, stream: Any, epoch: Epoch, model: str) -> bool | None:
        if model != "cpu":
            return False
        base = epoch.base
        if isinstance(base, torch.Tensor) and stream.model == "cpu":
            return mt19937.cache_valid(base)
        if isinstance(base, tuple) and base and base[0] == "seed":
            return False
        if stream.model != "cpu":
            return mt19937.cache_valid(self.cpu_start)
        return None  # a restored position: known once resolved

    # ------------------------------------------------------------- states

    def start_of(self, node: Any, model: str) -> torch.Tensor:
        stream, e, i = node.rng
        epoch = stream.epochs[e]
        return self.state_at(stream, epoch, model, self.layout(stream, epoch, model).starts[i])

    def end_of(self, stream: Any, epoch: Epoch, model: str) -> torch.Tensor:
        return self.state_at(stream, epoch, model, self.layout(stream, epoch, model).end)

    def after_call(self, node: Any, model: str) -> Position:
        stream, e, i = node.rng
        layout = self.layout(stream, stream.epochs[e], model)
        return layout.starts[i + 1] if i + 1 < len(layout.starts) else layout.end

    def remember(self, stream: Any, epoch: Epoch, model: str, position: Position, state) -> None:
        """A state a replay reached for real; a different known one means a wrong model."""
        key = (id(epoch), model, position.anchor)
        self._epochs[id(epoch)] = epoch
        entries = self._known.setdefault(key, [])
        i, hit = _index(entries, position)
        if hit:
            if not _same_state(entries[i][3], state):
                raise RuntimeError(
                    f"torchdefer's draw model is wrong for a random op of {stream} on this "
                    f"torch {torch.__version__}: the generator state replay reached differs "
                    "from the one computed. Please report this; set the environment variable "
                    "TORCHDEFER_RNG_JUMPS=0 to replay every random op in order instead."
                )
            return
        entries.insert(i, (position.words, _cache_key(position), position, state))
        if len(entries) > _KEEP:
            del entries[len(entries) // 2]  # keep the earliest and the latest

    def state_at(self, stream: Any, epoch: Epoch, model: str, position: Position) -> torch.Tensor:
        key = (id(epoch), model, position.anchor)
        entries = self._known.get(key)
        if not entries:
            anchor_state = self._anchor_state(stream, epoch, model, position.anchor)
            self.remember(stream, epoch, model, Position(position.anchor, 0), anchor_state)
            entries = self._known[key]
        found = self._exact(entries, position)
        if found is not None:
            return found
        state = self._reach(entries, position, model)
        self.remember(stream, epoch, model, position, state)
        return state

    def _exact(self, entries, position: Position) -> Any:
        i, hit = _index(entries, position)
        return entries[i][3] if hit else None

    def _reach(self, entries, position: Position, model: str) -> torch.Tensor:
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
            raise RuntimeError("internal: no known generator state before a position")
        state = mt19937.advance(state, words - known.words)
        if target == ANCHOR:
            return state
        state = _without_cache(state)
        if target is None:
            return state
        # The call that left this sample drew its last pair at word `target`.
        state = _one_normal(state)
        return mt19937.advance(state, position.words - target - 4)

    def _anchor_state(self, stream: Any, epoch: Epoch, model: str, anchor: int) -> torch.Tensor:
        if anchor >= 0:
            node = epoch.calls[anchor]
            starts = self.layout(stream, epoch, model).starts
            return _run_call(node, self.state_at(stream, epoch, model, starts[anchor]), model)
        base = epoch.base
        if isinstance(base, tuple) and len(base) == 3:  # a restored (stream, epoch, position)
            origin, restored, position = base
            return self.state_at(origin, restored, model, position)
        if isinstance(base, tuple) and base[0] == "seed":
            generator = torch.Generator(device="cpu" if model == "cpu" else stream.device)
            generator.manual_seed(base[1])
            return generator.get_state()
        if stream.model == model:
            return base
        # Replayed on another kind of device than recorded: start where that
        # device's default generator stood when recording began.
        if model == "cpu":
            return self.cpu_start
        generator = torch.Generator(device=stream.device)
        generator.manual_seed(torch.initial_seed())
        return generator.get_state()


def _cache_key(position: Position) -> int:
    cache = position.cache
    return -2 if cache == ANCHOR else -1 if cache is None else cache


def _index(entries: list, position: Position) -> tuple[int, bool]:
    """Where ``position`` sits among sorted ``entries``, and whether it is there."""
    sought = (position.words, _cache_key(position))
    i = bisect.bisect_left(entries, sought, key=lambda e: e[:2])
    return i, i < len(entries) and entries[i][:2] == sought


def _same_state(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)
