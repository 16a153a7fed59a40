"""Replaying random ops from exact private generator states; the global RNG is untouched.

Each random node starts from the state ``rng._states`` computes for its
position (jumping over the draws of everything not materialized), and the
state it ends in is remembered as the start of the next call of its stream,
so materializing in recording order draws each number once and jumps never.
A random call whose draws the model cannot count is run into scratch memory
when a later position needs its end (``run_call``).

A default generator is *borrowed* for the overloads that take no generator
argument (``randn.default``, ``bernoulli.p``): its state is saved, set, used
and restored in ``finally``. User generators are replaced by private copies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch

from torchdefer._compat.generator import get_state
from torchdefer.errors import DeviceUnavailableError, UntaggedRandomOpError
from torchdefer.recorder._args import unflatten_call
from torchdefer.recorder._composite import Composite
from torchdefer.recorder._graph import Node, TensorMeta, Value
from torchdefer.rng._ledger import default_generator
from torchdefer.rng._stream import Model, Stream, model_of
from torchdefer.rng.draws import TRUSTED_NAMESPACES

if TYPE_CHECKING:
    from torchdefer.materialize._replay import Replay

__all__ = ["NodeWithOverload", "RngReplay", "call_checking_draws", "draw", "generator_overload",
           "on_eager_devices", "takes_generator"]

# (node, stream, device, state, args, kwargs) -> (output, state after), or None to draw whole.
Splitter = Callable[[Any, Any, torch.device, torch.Tensor, tuple[Any, ...], dict[str, Any]],
                    tuple[torch.Tensor, torch.Tensor] | None]

# Random ops whose number of draws depends on the values of a tensor they
# write: in-place rrelu draws one uniform per element <= 0 of ``self``. Their
# scratch runs need those values, not uninitialized memory.
_DRAWS_READ_WRITTEN = frozenset({torch.ops.aten.rrelu_with_noise_})


class RngReplay:
    """Runs the random nodes of one replay."""

    def __init__(self, replay: Replay, split: Splitter) -> None:
        self.replay = replay
        # One scratch buffer per device, grown to the largest scratch draw.
        # Fresh tensors per draw would be freed at once, but glibc keeps
        # freed memory below its mmap threshold (bench/README.md).
        self._scratch: dict[torch.device, torch.UntypedStorage] = {}
        # Large CPU fills drawn on threads: parallel.split_draw, handed in by the
        # replay (parallel builds on this module's draw(); importing it here
        # would close a circle).
        self._split = split

    def run(self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        place = node.rng
        stream = place.stream  # type: ignore[union-attr]
        device = self.replay.map_device(stream.device)
        # "cpu" (mt19937), or the CUDA device whose launches count: replay runs on those.
        model: Model = model_of(device)  # type: ignore[assignment]
        states = node.graph.rng.states  # type: ignore[union-attr]
        start = states.start_of(node, model)
        split = self._split(node, stream, device, start, args, kwargs)
        out, after = split if split is not None else draw(node, stream, device, start, args, kwargs)
        epoch = stream.epochs[place.epoch]  # type: ignore[union-attr]
        states.remember(stream, epoch, model, states.after_call(node, model), after)
        return out

    def run_into_scratch(self, node: Node, state: torch.Tensor) -> torch.Tensor:
        """The state after ``node`` drawn from ``state``, its output thrown away."""
        stream = node.rng.stream  # type: ignore[union-attr]
        device = self.replay.map_device(stream.device)
        args, kwargs = self._scratch_args(node, device)
        _, after = draw(node, stream, device, state, args, kwargs)
        return after

    def release(self) -> None:
        """Give the scratch memory back now (a replay and its RngReplay form a cycle)."""
        self._scratch.clear()

    def _scratch_tensor(self, meta: TensorMeta, device: torch.device) -> torch.Tensor:
        """A tensor with ``meta``'s sizes and strides over the reused scratch buffer."""
        extent = 1 + sum((n - 1) * st for n, st in zip(meta.size, meta.stride) if n > 0)
        nbytes = extent * meta.dtype.itemsize if all(meta.size) else 0
        buffer = self._scratch.get(device)
        if buffer is None or buffer.nbytes() < nbytes:
            self._scratch[device] = buffer = torch.UntypedStorage(nbytes, device=device)
        out = torch.empty(0, dtype=meta.dtype, device=device)
        return out.set_(buffer, 0, meta.size, meta.stride)

    def _scratch_args(
        self, node: Node, device: torch.device
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Arguments that draw the same numbers as ``node`` did, into scratch memory."""
        written = {id(storage) for storage, _ in node.writes}
        op = node.op
        # A user's composite may draw as many numbers as the values it finds
        # in the tensors it writes; in-place rrelu does so for ``self``.
        every_written = isinstance(op, Composite) and op.steps is None
        first_written = getattr(op, "overloadpacket", None) in _DRAWS_READ_WRITTEN
        reads = list(node.reads)
        values = [leaf for leaf in node.leaves if isinstance(leaf, Value)]
        # The contents of every written argument, replayed together: they share
        # storage where eager's did (a composite may read through one what it
        # wrote through another, and draw as many numbers as what it reads).
        contents = [(v, r) for v, r in zip(values, reads) if id(v.storage) in written]
        reals: dict[int, torch.Tensor] = {}
        if every_written and contents:
            reals = dict(zip(map(id, (v for v, _ in contents)), self.replay.nested(contents)))
        reads_iter = iter(reads)
        leaves: list[Any] = []
        copies: dict[int, torch.UntypedStorage] = {}  # real storage -> its own copy
        for leaf in node.leaves:
            if isinstance(leaf, Value):
                version = next(reads_iter)
                if id(leaf.storage) in written:
                    if every_written:
                        leaf = _own_view(reals[id(leaf)], copies)
                    elif first_written and not leaves:
                        real = self.replay.nested([(leaf, version)])[0]
                        leaf = _own_view(real, copies)
                    else:
                        leaf = self._scratch_tensor(leaf.meta, device)
                else:  # e.g. the probabilities of bernoulli_(p_tensor): needs real values
                    leaf = self.replay.nested([(leaf, version)])[0]
            else:
                leaf = self.replay.map_leaf(leaf)
            leaves.append(leaf)
        return unflatten_call(leaves, node.spec)


def _own_view(real: torch.Tensor, copies: dict[int, torch.UntypedStorage]) -> torch.Tensor:
    """``real`` as a view of a copy of its whole storage, one copy per storage.

    Arguments that share a written storage (``fn(w, w[0])``) must share it in
    the scratch run as in eager's: how far such a function moves the generator
    may depend on what it reads through one after writing through the other.
    """
    storage = real.untyped_storage()
    own = copies.get(storage.data_ptr())
    if own is None:
        own = copies[storage.data_ptr()] = storage.clone()
    out = torch.empty(0, dtype=real.dtype, device=real.device)
    return out.set_(own, real.storage_offset(), real.size(), real.stride())


# Tensor arguments eager takes on the CPU whatever the call's device (the
# ``high`` of ``randint_like.Tensor``: "high must be a scalar tensor and on
# CPU"). A replay onto another device moves every value it makes; these go back.
_CPU_ARGUMENTS: dict[Any, frozenset[str]] = {torch.ops.aten.randint_like: frozenset({"high"})}


def on_eager_devices(
    node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args, kwargs`` with the tensors eager requires on the CPU moved back there."""
    names = _CPU_ARGUMENTS.get(getattr(node.op, "overloadpacket", None))
    if not names:
        return args, kwargs
    schema = node.op._schema
    positional = [a.name for a in schema.arguments if not a.kwarg_only]

    def place(name: str, x: Any) -> Any:
        if name in names and isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return x.cpu()
        return x

    args = tuple(place(positional[i] if i < len(positional) else "", x) for i, x in enumerate(args))
    return args, {k: place(k, x) for k, x in kwargs.items()}


# A default generator is borrowed only where no private one can be given: a
# CUDA call (its Philox state is offset bookkeeping of the device's default
# generator) or an op with no overload taking ``generator=``. The borrowers
# take it one at a time, or one thread would draw from the state another set.
# So does a call checked for draws from the default generators (it reads and
# puts back their states): re-entrant, as such a call may replay a random op.
_DEFAULT_GENERATOR = threading.RLock()


def draw(
    node: Node,
    stream: Stream,
    device: torch.device,
    state: torch.Tensor,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[Any, torch.Tensor]:
    """Run random ``node`` from generator ``state``; returns (output, state after).

    Every CPU call draws from a private generator: one recorded without
    ``generator=`` (``torch.randn(n)`` is ``aten.randn.default``) runs as its
    sibling overload that takes one (:func:`generator_overload`), the same
    kernel. So calls on several threads (the chunks of a split call, a
    sharded rank's rows) never share a generator.
    """
    args, kwargs = on_eager_devices(node, args, kwargs)
    if stream.generator is None and not takes_generator(node, args, kwargs):
        sibling = generator_overload(node) if torch.device(device).type == "cpu" else None
        if sibling is None:
            return _borrowing_default(node, device, state, args, kwargs)
        node = cast(Node, sibling)  # read as a Node: every field is the node's own but op
    private = torch.Generator(device=device)
    private.set_state(state)
    if stream.generator is None:
        kwargs = {**kwargs, "generator": private}
    else:
        args = tuple(private if isinstance(x, torch.Generator) else x for x in args)
        kwargs = {k: private if isinstance(x, torch.Generator) else x for k, x in kwargs.items()}
    out = node.op(*args, **kwargs)
    return out, get_state(private)


def _borrowing_default(
    node: Node,
    device: torch.device,
    state: torch.Tensor,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[Any, torch.Tensor]:
    """``node`` run on ``device``'s default generator set to ``state``, then restored.

    One default generator serves every thread: threads take it one at a time,
    or one would draw from the state another just set (CUDA calls, and ops
    with no overload taking ``generator=``).
    """
    generator = default_generator(device)
    if generator is None:
        raise DeviceUnavailableError(
            f"{node.name}, recorded at {node.where()}, draws from the default generator of "
            f"{device}, and this process has none: no such device here, or a device type "
            "torchdefer does not replay random ops on (it replays them on cpu and cuda). "
            "Materialize onto a device this process has, e.g. device='cpu'.")
    with _DEFAULT_GENERATOR:
        saved = get_state(generator)  # as it is: a marker while recording
        try:
            generator.set_state(state)
            out = node.op(*args, **kwargs)
            return out, get_state(generator)
        finally:
            generator.set_state(saved)


# Overloads that draw from the default generator, and their siblings taking
# ``generator=`` (kwarg-only, same other arguments: checked on the schemas).
_GENERATOR_SIBLINGS = {
    "default": "generator", "low": "low_generator", "low_dtype": "low_generator_dtype",
    "Tensor": "Tensor_generator", "out": "generator_out", "low_out": "low_generator_out",
    "Tensor_out": "Tensor_generator_out", "low_dtype_out": "low_generator_dtype_out",
}  # fmt: skip


class NodeWithOverload:
    """``node`` as if recorded with another overload of its op (everything else its own)."""

    def __init__(self, node: Any, op: Any) -> None:
        self._node = node
        self.op = op

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)


def generator_overload(node: Any) -> NodeWithOverload | None:
    """``node`` calling the overload of its op that takes ``generator=``; None if none.

    ``torch.randn(n)`` is ``aten.randn.default``, which draws from the default
    generator: the same kernel as ``aten.randn.generator`` given it.
    """
    try:
        other = _siblings[node.op]
    except KeyError:
        other = _siblings[node.op] = _sibling_of(node.op)
    except TypeError:  # an unhashable op (a Python function): none
        return None
    return None if other is None else NodeWithOverload(node, other)


_siblings: dict[Any, Any] = {}  # op -> its overload taking generator=, or None (schemas once)


def _sibling_of(op: Any) -> Any:
    sibling = _GENERATOR_SIBLINGS.get(getattr(op, "_overloadname", ""))
    packet = getattr(op, "overloadpacket", None)
    if sibling is None or packet is None or sibling not in packet.overloads():
        return None
    other = getattr(packet, sibling)
    mine = [(a.name, a.kwarg_only) for a in op._schema.arguments]
    theirs = [(a.name, a.kwarg_only) for a in other._schema.arguments if a.name != "generator"]
    takes = [a for a in other._schema.arguments if a.name == "generator" and a.kwarg_only]
    return other if mine == theirs and takes else None


def call_checking_draws(node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run a node recorded as deterministic; refuse if it drew from a default generator.

    Ops of other libraries are recorded as random (``recorder._record``); what
    is left here is a Python function marked ``composite(random=False)``
    that draws after all: replay would feed it whatever state the global
    generator has now, a value eager code never saw.
    """
    if getattr(node.op, "namespace", None) in TRUSTED_NAMESPACES:
        return node.op(*args, **kwargs)
    generators = _default_generators()
    # Under the borrowers' lock: another thread's replay borrowing a default
    # generator (materialize_module(threads=N)) would look like a draw here,
    # and putting the state back would move its generator under it.
    with _DEFAULT_GENERATOR:
        before = [get_state(g) for g in generators]
        out = node.op(*args, **kwargs)
        moved = [g for g, s in zip(generators, before) if not torch.equal(get_state(g), s)]
        for g, s in zip(generators, before):
            g.set_state(s)
    if moved:
        raise UntaggedRandomOpError(
            f"{node.name}, recorded at {node.where()}, drew random numbers from the default "
            f"{moved[0].device} generator, but it is not tagged as random "
            "(torch.Tag.nondeterministic_seeded), so it was recorded as deterministic and "
            "its draws cannot be placed where eager code made them. Tag the op "
            "(torch.library.custom_op(..., tags=torch.Tag.nondeterministic_seeded) or "
            "define(..., tags=...)), or mark a Python init function with "
            "torchdefer.composite(fn, random=True)."
        )
    return out


def _default_generators() -> list[torch.Generator]:
    generators = [torch.default_generator]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        generators.extend(torch.cuda.default_generators)
    return generators


def takes_generator(node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the recorded overload accepts ``generator=`` as a keyword we can fill."""
    schema = getattr(node.op, "_schema", None)
    if schema is None:
        return False
    for i, argument in enumerate(schema.arguments):
        if argument.name == "generator":
            return argument.kwarg_only and i >= len(args)
    return False
