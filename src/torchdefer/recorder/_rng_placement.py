"""Random ops of a recording in their generator's stream (``rng._ledger`` does the accounting).

Recording never draws (kernels run on meta), yet eager code would have moved
the generator by every draw. The ledger gives each random node its position
and keeps the real generator where eager code would have left it. What the
recorder adds is *when* a marker may stand in for the exact state:

* outside ``deferred_init`` (``model.apply(init_fn)`` on a deferred model):
  never; each recorded random op moves the generator at once;
* inside it: while the recording thread is the only Python thread (torchdefer's
  kept draw threads aside: they draw only while their caller waits) and every
  read of a generator's state is seen (``_compat.generator`` intercepts
  ``Generator.get_state`` and its neighbours while a recording runs, and
  ``recorder._threads`` routes each read to the reading thread's recording,
  which syncs first). The block's end syncs too.

It also tells rng how to read a node's arguments (:data:`NODE_READER`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

from torchdefer._compat.generator import get_state
from torchdefer.errors import RecordingError
from torchdefer.recorder._args import unflatten_call
from torchdefer.recorder._graph import Value
from torchdefer.recorder._threads import reads_seen, recording_thread
from torchdefer.rng import kept_threads
from torchdefer.rng._ledger import RngLedger, cuda_states
from torchdefer.rng._stream import CallReader
from torchdefer.rng.draws import TensorInfo

__all__ = ["NODE_READER", "RngRecorder", "meta_call"]


def meta_call(node: Any) -> tuple[tuple, dict, TensorInfo | None]:
    """``node``'s call with the metadata of its tensors, and of the tensor it draws into."""

    def meta(leaf: Any) -> Any:
        if isinstance(leaf, Value):
            m = leaf.meta
            return TensorInfo(m.size, m.stride, m.dtype)
        return leaf

    args, kwargs = unflatten_call([meta(leaf) for leaf in node.leaves], node.spec)
    drawn = meta(node.outputs[0]) if node.outputs else None
    return args, kwargs, drawn


# Argument types whose value (with its type) is the whole of what the model reads.
_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                    torch.memory_format})


def _signature(node: Any) -> tuple | None:
    """What the draw model reads of ``node``'s call, hashable; None if unsure."""
    parts: list[Any] = [node.op, node.spec]
    for leaf in node.leaves:
        kind = type(leaf)
        if kind is Value:
            m = leaf.meta
            parts.append((m.size, m.stride, m.dtype))
        elif kind in _PLAIN:
            parts.append((kind, leaf))
        elif kind is torch.Generator:  # which one does not change the draws
            parts.append(kind)
        else:
            return None
    if node.outputs:
        m = node.outputs[0].meta
        parts.append((m.size, m.stride, m.dtype))
    return tuple(parts)


NODE_READER = CallReader(describe=meta_call, signature=_signature)
"""How rng reads a recorded node's arguments."""


def _alone() -> bool:
    """Whether the calling thread is the only one that may draw: no other Python thread
    but torchdefer's kept draw threads (``rng.kept_threads``), which run only while a
    split draw's caller waits for them (a threaded materialization keeps them
    alive; counting them would make every later recording move the generator
    to its exact state after each random op, a jump each)."""
    others = threading.active_count() - 1
    return others == 0 or others == kept_threads()


class RngRecorder(RngLedger):
    """The ledger of one recording, with the recording's rules for markers."""

    def __init__(self) -> None:
        from torchdefer.recorder._mode import suspended

        # The states kept here are written in place later, maybe outside the
        # inference mode a recording began in: never inference tensors.
        with suspended(), torch.inference_mode(False):
            cpu_start = get_state(torch.default_generator)
            cuda_start = cuda_states()
        super().__init__(NODE_READER, cpu_start, cuda_start)
        self._deferring = 0  # nesting depth of deferred_init blocks
        self._thread: int | None = None

    def unknown_generator(self, device: torch.device) -> Exception:
        return RecordingError(str(super().unknown_generator(device)))

    def place(self, node: Any, generator: torch.Generator | None,  # type: ignore[override]
              device: torch.device) -> None:
        """Give ``node`` its place in its stream; move the real generator past it.

        Never for a call on meta (the recorder makes it an ordinary node: eager's
        kernels there touch no generator).
        """
        if torch.is_inference_mode_enabled():
            super().place(node, generator, device, self._lazy())
        else:  # what RngLedger.place does then, one call fewer for each random op
            self._place(node, generator, device, self._lazy())

    def place_plain(self, node: Any, device: torch.device, key: tuple[Any, ...]) -> None:
        """:meth:`place` of a call on ``device``'s default generator that ``key`` describes
        wholly (``rng._stream.plain_cpu_effect``); its common case in one step
        (``RngLedger.try_place_plain``), the rest by :meth:`place`.

        ``device`` is not meta.
        """
        if not (
            self._deferring  # self._lazy(), inline: this runs for every random op
            and threading.get_ident() == self._thread
            and _alone()
            and reads_seen()
            and not torch.is_inference_mode_enabled()
            and self.try_place_plain(node, device, key)
        ):
            self.place(node, None, device)

    def sync(self, generator: torch.Generator | None = None) -> None:
        from torchdefer.recorder._mode import suspended

        if generator is not None and not self.tracks(generator):
            return  # a generator no recorded op drew from (torchdefer's own, often)
        with suspended(), torch.inference_mode(False):
            super().sync(generator)

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
            and _alone()
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
