"""Large CPU random fills drawn on several threads: the ``threads=`` of materialization.

``materialize_module(model, threads=N)`` (and ``materialize_tensor``,
``replay_value``, the row path of sharded ranks) draws each large random
call of the replay in up to ``N`` chunks, each on its own thread from its own
generator state reached by jump-ahead, into a view of the output. The bits
are eager's, and the generator state after the call is the one the whole call
leaves: ``rng._chunks`` says which calls split where and why the others do
not. Everything else in a replay runs as before, one op after the other.

``threads`` defaults to ``torch.get_num_threads()`` (what torch's intra-op
setting allows). ``threads=1`` draws every call whole.

>>> import torch, torchdefer
>>> _ = torch.manual_seed(0); eager = torch.nn.Linear(1024, 1024)
>>> _ = torch.manual_seed(0); lazy = torchdefer.deferred_init(torch.nn.Linear, 1024, 1024)
>>> _ = torchdefer.materialize_module(lazy, threads=2)
>>> torch.equal(lazy.weight, eager.weight)
True
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any, cast

import torch

from torchdefer.errors import ThreadsError
from torchdefer.materialize._overwrites import writes_first_argument
from torchdefer.materialize._rng_replay import (
    NodeWithOverload,
    draw,
    generator_overload,
    takes_generator,
)
from torchdefer.recorder._graph import Node
from torchdefer.rng import _chunks as chunks
from torchdefer.rng import _ranges as ranges
from torchdefer.rng import mt19937
from torchdefer.rng.draws import NORMAL_BLOCKS

_aten = torch.ops.aten

__all__ = ["check_threads", "chunk_floor", "chunk_lead", "current_threads", "min_chunk",
           "split_draw", "threads_used"]

# The threads of the materialization running in this context (None: torch's
# intra-op setting), and the smallest chunk (tests lower it to split small calls).
_threads: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "torchdefer_threads", default=None
)
_min_chunk: contextvars.ContextVar[int] = contextvars.ContextVar(
    "torchdefer_min_chunk", default=chunks.MIN_CHUNK
)


def check_threads(threads: Any, where: str) -> int | None:
    """``threads`` if it is None or a positive int; a :class:`ThreadsError` naming ``where``."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ThreadsError(
            f"{where}(threads={threads!r}): threads is the number of threads drawing "
            "large random fills, a positive int (1 draws each call whole), or None for "
            f"torch.get_num_threads() (now {torch.get_num_threads()})."
        )
    return threads


@contextlib.contextmanager
def threads_used(threads: int | None) -> Iterator[None]:
    """Replays in this block draw large CPU fills on ``threads`` threads (None: the default).

    An inner block with ``threads=None`` keeps the outer block's setting.
    """
    if threads is None:
        yield
        return
    token = _threads.set(threads)
    try:
        yield
    finally:
        _threads.reset(token)


def current_threads() -> int:
    """The threads a replay here may draw one call on."""
    threads = _threads.get()
    return torch.get_num_threads() if threads is None else threads


def chunk_floor() -> int:
    """The fewest elements a chunk may have here (``rng._chunks.MIN_CHUNK`` unless lowered)."""
    return _min_chunk.get()


@contextlib.contextmanager
def min_chunk(elements: int) -> Iterator[None]:
    """Split calls into chunks of as few as ``elements`` (for tests and benchmarks)."""
    token = _min_chunk.set(elements)
    try:
        yield
    finally:
        _min_chunk.reset(token)


def chunk_lead() -> int:
    """The first chunk's head start here (``chunks.LEAD``), scaled down with a lowered
    floor so that tests splitting small calls split them unevenly too."""
    floor = _min_chunk.get()
    return chunks.LEAD if floor >= chunks.MIN_CHUNK else floor // 2


def split_draw(node: Any, stream: Any, device: torch.device, state: torch.Tensor,
               args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Draw random ``node`` in chunks on threads: ``(output, state after)``; None if whole.

    Only CPU calls into a contiguous tensor of at least two chunks, whose
    class of call ``rng._ranges`` has checked slices on this torch, and which
    draw from a private generator (one borrowed default generator cannot
    serve two threads).
    """
    threads = current_threads()
    floor = _min_chunk.get()
    if threads < 2 or device.type != "cpu":
        return None
    if not node.outputs or len(node.outputs) != 1:
        return None
    meta = node.outputs[0].meta
    out = _drawn_into(node, args)
    if out is None and not _plain_factory_output(node):
        return None
    n = math.prod(meta.size)
    if n < 2 * floor:
        return None
    if stream.generator is None and not takes_generator(node, args, kwargs):
        node = generator_overload(node)
        if node is None:  # one borrowed default generator cannot serve two threads
            return None
    from torchdefer.materialize._local_call import BLOCKS, PER_ELEMENT, LocalCall, NotSliceable

    packet = getattr(node.op, "overloadpacket", None)
    if packet not in PER_ELEMENT and packet not in BLOCKS and packet not in _PAIRS:
        return None
    try:
        call = LocalCall(node, device)
    except NotSliceable:
        return None
    effect = call.effect_of(n)
    if effect is None:
        return None
    if packet in _PAIRS:
        return _split_pairs(call, effect, n, out, meta, state, threads, floor)
    if effect.normals:
        return None
    model = ranges.element_model(call.key, packet in NORMAL_BLOCKS, call.effect_of, call.run,
                                 call.dtype, device)
    if model is None:
        return None
    starts = chunks.bounds(n, model, threads, floor, chunk_lead())
    if len(starts) < 3:
        return None
    run = call.run
    if out is None:  # a factory: its output as eager's (contiguous, not pinned)
        out = torch.empty(meta.size, dtype=meta.dtype, device=device)
        run = _drawing_into(call) or run
    elif not out.is_contiguous() or tuple(out.shape) != tuple(meta.size):
        return None
    after = chunks.draw_chunks(model, out.view(-1), state, run, starts)
    return out, after


# In-place ops on the cached-normal path: each sample from at::normal_distribution
# <double> (a cached normal, or a new pair of which it caches the second).
_PAIRS = frozenset({_aten.log_normal_})
_pairs_checked: dict[Any, bool] = {}  # class of call -> whether it splits (probed once)


def _split_pairs(call: Any, effect: Any, n: int, out: torch.Tensor | None, meta: Any,
                 state: torch.Tensor, threads: int,
                 floor: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A cached-normal call (``log_normal_``) in chunks that start after whole pairs."""
    if out is None or effect.words or effect.normals != n or not out.is_contiguous():
        return None
    if tuple(out.shape) != tuple(meta.size) or not _pairs_split(call):
        return None
    starts = chunks.pair_bounds(n, mt19937.cache_valid(state), threads, floor)
    if len(starts) < 3:
        return None
    return out, chunks.draw_pairs(out.view(-1), state, call.run, starts)


def _pairs_split(call: Any) -> bool:
    """Whether ``call``'s class draws whole and in pairs alike (probed once, from a
    state with and without a cached normal, cut at every place a chunk may start)."""
    known = _pairs_checked.get(call.key)
    if known is None:
        known = _pairs_checked[call.key] = all(_probe_pairs(call, cached) for cached in (0, 1))
    return known


def _probe_pairs(call: Any, cached: int) -> bool:
    g = torch.Generator().manual_seed(0xCA5E + cached)
    torch.empty(cached, dtype=torch.float64).normal_(generator=g)  # 1: leaves one cached
    state = g.get_state()
    n = 41
    whole = torch.empty(n, dtype=call.dtype)
    end = call.run(whole, state)
    for starts in ([0, cached + 2, n], [0, cached + 10, cached + 20, n], [0, n - 1, n]):
        if (starts[-2] - cached) % 2:
            continue
        pieces = torch.empty(n, dtype=call.dtype)
        after = chunks.draw_pairs(pieces, state, call.run, starts)
        if not (torch.equal(pieces, whole) and torch.equal(after, end)):
            return False
    return True


def _drawn_into(node: Any, args: tuple[Any, ...]) -> torch.Tensor | None:
    """The tensor an in-place random op writes (its ``self``); None for a factory."""
    if writes_first_argument(node.op) and args and isinstance(args[0], torch.Tensor):
        return args[0]
    return None


def _plain_factory_output(node: Any) -> bool:
    """Whether a factory's recorded output is what ``torch.empty(size)`` gives:
    contiguous, at offset 0, on its own storage, not page-locked."""
    value = node.outputs[0]
    meta = value.meta
    if writes_first_argument(node.op) or value.storage.pinned or meta.offset:
        return False
    return tuple(meta.stride) == _contiguous_strides(meta.size)


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(size):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


# Factories whose out= overload is theirs with the output given: ``randn_out``
# is ``out.resize_(size).normal_(0, 1, generator)`` as ``randn`` is
# ``empty(size).normal_(0, 1, generator)`` (``*_like``'s out= overloads are
# generated ones that copy, so they gain nothing).
_INTO = frozenset({_aten.randn, _aten.rand, _aten.randint, _aten.normal})


def _drawing_into(call: Any) -> Any:
    """A runner drawing a factory's chunk straight into its view (no temporary of the
    chunk's size), through the op's out= overload; None if it has none that fits."""
    op = call.node.op
    packet = op.overloadpacket
    name = f"{op._overloadname}_out"
    if packet not in _INTO or name not in packet.overloads():
        return None
    into = getattr(packet, name)
    positional = [a.name for a in op._schema.arguments if not a.kwarg_only]
    if positional != [a.name for a in into._schema.arguments if not a.kwarg_only]:
        return None
    names = {a.name for a in into._schema.arguments}
    # Read as a Node: every field is the node's own but op.
    node = cast(Node, NodeWithOverload(call.node, into))

    def run(view: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        args, kwargs = call._call(view)  # the size is the view's; dtype etc. are view's
        kwargs = {k: v for k, v in kwargs.items() if k in names}
        _, after = draw(node, call.stream, call.device, state, args, {**kwargs, "out": view})
        return after

    return run
