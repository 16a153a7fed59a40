"""Recording a whole Python function as one node: data-dependent init functions.

Since torch 2.12, ``nn.init.trunc_normal_`` is a rejection loop: it draws,
reads the values (``mask.any()``) and draws again. Recorded op by op, every
read would materialize the tensor during recording (seconds and gigabytes per
layer of a large model). Recorded as one node instead, nothing is allocated:
replay calls the function on the real tensor, with its generator at the
position eager code had. How far the function moves the generator depends on
the data, so its end is an *anchor* of its stream: reaching a later position
runs it (``rng._stream``).

:func:`composite` marks a user's own such function the same way. Library
functions known to read data are marked for the time a recording runs
(:func:`library_composites`), checked once per process by running them on a
small real tensor. After ``deferred_init`` returned, ``trunc_normal_`` on a
deferred tensor is recorded the same way (:func:`library_call_asking_is_meta`).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TypeVar, overload

import torch
from torch.overrides import TorchFunctionMode

from torchdefer import _compat
from torchdefer._compat.patch import PatchStack, SharedPatches, attribute, patched
from torchdefer.errors import RecordingError
from torchdefer.recorder._args import flatten_call
from torchdefer.recorder._graph import NodeKind, TensorMeta, Value
from torchdefer.recorder._mode import suspended
from torchdefer.recorder._nodes import as_deferred, generator_of, record_writes, where
from torchdefer.recorder._refusals import eager_refuses
from torchdefer.recorder._tensor import DeferredTensor
from torchdefer.recorder._trunc_normal import one_normal, rejection_end, rejection_loop

__all__ = ["Composite", "composite", "library_call_asking_is_meta", "library_composites"]

F = TypeVar("F", bound=Callable[..., object])


class Composite:
    """What replay needs to know about a function recorded as one node."""

    __slots__ = ("fn", "random", "rows", "steps", "writes")

    def __init__(self, fn: Callable[..., Any], writes: tuple[int, ...], random: bool) -> None:
        self.fn = fn
        self.writes = writes  # positional indices of the tensors it changes in place
        self.random = random
        # steps(cpu_state, *args, **kwargs) -> the CPU state after the call, learnt
        # without running it whole (tensors given as rng.draws.TensorInfo), or None.
        self.steps: Callable[..., torch.Tensor | None] | None = None
        # rows(*args, **kwargs) -> an object whose .rows(s, e, out, state_at) gives
        # elements [s, e) of the written tensor from their own draws, or None.
        self.rows: Callable[..., Any] | None = None

    @property
    def __name__(self) -> str:  # what graph views print
        return getattr(self.fn, "__name__", repr(self.fn))

    def __repr__(self) -> str:
        return f"composite {getattr(self.fn, '__qualname__', self.__name__)}"

    def __call__(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        """Run on real tensors; returns the written tensors, in ``writes`` order."""
        self.fn(*args, **kwargs)
        return [args[i] for i in self.writes]


@overload
def composite(fn: F, *, writes: tuple[int, ...] = ..., random: bool = ...) -> F: ...


@overload
def composite(
    fn: None = None, *, writes: tuple[int, ...] = ..., random: bool = ...
) -> Callable[[F], F]: ...


def composite(
    fn: F | None = None, *, writes: tuple[int, ...] = (0,), random: bool = True
) -> F | Callable[[F], F]:
    """Record calls of ``fn`` on deferred tensors as one node, replayed by calling ``fn``.

    For init functions that read the values they draw (rejection sampling)
    or otherwise cannot be recorded op by op cheaply. ``fn`` must change the
    tensors at positional indices ``writes`` in place, draw (if ``random``)
    from one generator only (its ``generator=`` argument, else the default
    generator of the first written tensor's device), and read no other state
    that changes later. It returns its first written tensor when recorded.

    Args:
        fn: the function (or use ``@composite(writes=...)`` as a decorator).
        writes: positional indices of the arguments it writes.
        random: whether it draws random numbers.

    >>> import torch, torchdefer
    >>> @torchdefer.composite
    ... def clipped_normal_(t, limit=2.0):
    ...     t.normal_()
    ...     while bool((t.abs() > limit).any()):  # reads data: rejection loop
    ...         t.copy_(torch.where(t.abs() > limit, torch.randn_like(t), t))
    ...     return t
    >>> _ = torch.manual_seed(0); eager = clipped_normal_(torch.empty(100))
    >>> _ = torch.manual_seed(0); lazy = torchdefer.deferred_init(
    ...     lambda: clipped_normal_(torch.empty(100)))
    >>> torch.equal(torchdefer.materialize_tensor(lazy), eager)
    True
    """
    if fn is None:
        return lambda f: composite(f, writes=writes, random=random)
    marked = Composite(fn, tuple(writes), random)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not any(isinstance(args[i], DeferredTensor) for i in marked.writes if i < len(args)):
            return fn(*args, **kwargs)
        return record_composite(marked, args, kwargs)

    wrapper.__torchdefer_composite__ = marked  # type: ignore[attr-defined]
    return wrapper


def _composite_of(wrapper: Callable[..., object]) -> Composite:
    """The :class:`Composite` a :func:`composite` wrapper carries."""
    marked: Composite = wrapper.__torchdefer_composite__  # type: ignore[attr-defined]
    return marked


def record_composite(marked: Composite, args: tuple, kwargs: dict) -> Any:
    """Record one call of ``marked``; returns its first written (deferred) tensor."""
    written = [args[i] for i in marked.writes]
    if not all(isinstance(t, DeferredTensor) for t in written):
        raise RecordingError(
            f"{marked!r} writes arguments {marked.writes} in place, but some are real tensors "
            f"and some deferred (called at {where()}). Pass only deferred tensors, or "
            "materialize them first."
        )
    if eager_refuses(marked.fn, args, kwargs, written, marked.random):
        return marked.fn(*args, **kwargs)  # op by op: each op refused where eager refuses it
    graph = written[0]._graph
    flat, spec = flatten_call(args, kwargs)
    leaves, inputs, reads = list(flat), [], []
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor):
            x = as_deferred(graph, x, marked)
            inputs.append(x._value)
            reads.append(x._value.storage.version)
            leaves[i] = x._value
    device = written[0].fake_device
    # On meta nothing is drawn (eager's kernels there touch no generator): an
    # ordinary write, replayed as one.
    random = marked.random and device.type != "meta"
    kind = NodeKind.RANDOM if random else NodeKind.INPLACE
    # No ambient: replay calls the function, under the caller's settings.
    node = graph.add_node(kind, marked, leaves, spec, tuple(inputs), tuple(reads),
                          runs_kernel=False)
    node.writes = record_writes(node, written, tuple(range(len(written))))
    for k, t in enumerate(written):
        t._value = Value(node, k, t._value.storage, TensorMeta.of(t, t.fake_device))
        node.outputs.append(t._value)
    if random:
        graph.rng.place(node, generator_of(kwargs, flat), device)
    return written[0]


# Library functions that may read the data they draw, by (module, attribute).
# `trunc_normal_` calls `_no_grad_trunc_normal_` through the module's globals,
# so marking the latter also covers `from torch.nn.init import trunc_normal_`.
# The probe runs the function once on a real tensor, its device and dtype
# named: a device context or default dtype in force must not decide it.
def _probe_trunc_normal(f: Callable[..., Any]) -> None:
    f(torch.empty(64, dtype=torch.float32, device="cpu"), 0.0, 1.0, -2.0, 2.0)


_LIBRARY: tuple[tuple[Any, str, Callable[[Callable[..., Any]], None]], ...] = (
    (torch.nn.init, "_no_grad_trunc_normal_", _probe_trunc_normal),
)


def _library_wrapper(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """The recording stand-in of a data-reading library function."""
    marked = composite(original, writes=(0,), random=True)
    if name != "_no_grad_trunc_normal_":
        return marked
    # `run`: the uniform branch's stepping is checked against torch's own function.
    info = _composite_of(marked)
    info.steps = functools.partial(rejection_end, run=original)
    info.rows = functools.partial(rejection_loop, run=original)

    @functools.wraps(original)
    def trunc_normal(tensor, mean, std, a, b, generator=None):
        # Bounds no value can reach: the loop is its first normal_ (recorder._trunc_normal).
        if isinstance(tensor, DeferredTensor) and one_normal(original, tensor, mean, std, a, b):
            with torch.no_grad():
                tensor.normal_(mean, std, generator=generator)
            return tensor
        return marked(tensor, mean, std, a, b, generator=generator)

    trunc_normal.__torchdefer_composite__ = info  # type: ignore[attr-defined]
    return trunc_normal


class _DataReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from torchdefer.fake._tensor import DATA_READS

        if func in DATA_READS or func in (torch.Tensor.any, torch.Tensor.all):
            self.seen = True
        return func(*args, **(kwargs or {}))


@functools.cache
def _reads_data(module: Any, name: str) -> bool:
    """Whether this torch's ``module.name`` reads what it draws (checked once)."""
    probe = next(p for m, n, p in _LIBRARY if m is module and n == name)
    mode = _DataReads()
    state = torch.default_generator.get_state()
    try:
        with mode:
            probe(getattr(module, name))
    finally:
        torch.default_generator.set_state(state)
    return mode.seen


@contextlib.contextmanager
def library_composites() -> Iterator[None]:
    """Mark the data-reading library init functions as composites while recording."""
    # While any thread records: one thread's block ending first must not unmark
    # them under another's (which then read their data, op by op).
    with _LIBRARY_PATCHES.held():
        yield


def _mark_library(patches: PatchStack) -> None:
    for module, name, _ in _LIBRARY:
        original = getattr(module, name)
        if hasattr(original, "__torchdefer_composite__"):
            continue  # marked by the user
        with suspended():
            reads = _reads_data(module, name)
        if reads:
            patches.enter(
                patched(attribute(module, name), _library_wrapper(name, original)))


_LIBRARY_PATCHES = SharedPatches(_mark_library)


# ------------------------------------------------- calls after deferred_init returned

_IS_META = _compat.descriptor_get(torch.Tensor, "is_meta")
_inside = threading.local()  # .active: this thread is recording such a call


def library_call_asking_is_meta(tensor: DeferredTensor) -> bool | None:
    """``tensor.is_meta``, asked of a deferred tensor outside a recording: True when
    torch's ``trunc_normal_`` asks it, after recording the call here; None otherwise.

    After ``deferred_init`` returned (torchtitan builds, then calls
    ``model.init_weights()``), the library functions are no longer replaced,
    and torch's rejection loop recorded op by op would materialize the tensor
    at every ``mask.any()``. Its first question is ``tensor.is_meta``, and a
    meta tensor makes it return at once: so the call is recorded as inside a
    recording (one ``normal_`` where proven, else the composite), and the
    answer True ends torch's function without a draw. Checked once per process
    on the installed torch (:func:`_asks_is_meta_first`).
    """
    if getattr(_inside, "active", False):
        return None  # the call is being recorded op by op (an eager refusal): plain answer
    if tensor.fake_device.type == "meta":
        return None  # its own answer, True: torch returns without a draw, as eager does
    original = _library_original()
    if original is None:
        return None
    local = _locals_of(original.__code__, tensor)
    if local is None:
        return None
    _inside.active = True
    try:
        with torch.no_grad():
            _after_recording_wrapper(original)(
                tensor, local["mean"], local["std"], local["a"], local["b"],
                generator=local.get("generator"),
            )
    finally:
        _inside.active = False
    return True


def _library_original() -> Callable[..., Any] | None:
    """torch's ``_no_grad_trunc_normal_`` where this hook applies to it, else None."""
    fn = getattr(torch.nn.init, "_no_grad_trunc_normal_", None)
    fn = getattr(fn, "__wrapped__", fn)  # another thread's recording may have wrapped it
    if fn is None or getattr(fn, "__code__", None) is None:
        return None
    return fn if _hookable(fn) else None


@functools.cache  # asked at every is_meta of a deferred tensor outside a recording
def _hookable(fn: Callable[..., Any]) -> bool:
    with suspended():  # torch < 2.12: op by op, no data read (or a function not read here)
        return _reads_data(torch.nn.init, "_no_grad_trunc_normal_") and _asks_is_meta_first(fn)


def _locals_of(code: Any, tensor: Any, depth: int = 6) -> dict[str, Any] | None:
    """The arguments of the frame running ``code`` on ``tensor`` that asked, if any."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        if frame.f_code is code:
            local = frame.f_locals
            return local if local.get("tensor") is tensor else None
        frame = frame.f_back
    return None


@functools.cache
def _asks_is_meta_first(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s first question of its tensor is ``is_meta`` and a meta tensor
    makes it return that tensor at once (so answering True skips it whole)."""
    mode = _Questions()
    probe = torch.empty(64, dtype=torch.float32, device="meta")
    with mode:
        result = fn(probe, 0.0, 1.0, -2.0, 2.0)
    return result is probe and mode.seen == [_IS_META]


class _Questions(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


@functools.cache
def _after_recording_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    return _library_wrapper("_no_grad_trunc_normal_", original)
