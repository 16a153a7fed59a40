"""materialize_tensor and materialize_module: the public entry points of replay."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Generator
from typing import TypeVar

import torch
from torch import nn

from torchdefer import _compat
from torchdefer._hooks import SHARDED_MATERIALIZER, VALUE_READER
from torchdefer.errors import UsageTypeError
from torchdefer.fake._output_device import device_available
from torchdefer.materialize import _parallel as parallel
from torchdefer.materialize import concurrent
from torchdefer.materialize._cache import cache_for
from torchdefer.materialize._convert import cast, check_dtype
from torchdefer.materialize._replay import Replay
from torchdefer.materialize._swap import real_tensor, recorded_inference, swap_in
from torchdefer.materialize.progress import Progress, ProgressSpec
from torchdefer.recorder._graph import TensorMeta, Value
from torchdefer.recorder._mode import suspended
from torchdefer.recorder._reach import GRAD, PARAMETER, reached_tensors
from torchdefer.recorder._target import Target, mark_materialized, target_of
from torchdefer.recorder._tensor import DeferredTensor, holds_deferred
from torchdefer.recorder._ties import warn_broken_ties

__all__ = ["deferred_reached", "mark_replayed", "materialize_module", "materialize_tensor",
           "replay_tensors"]

M = TypeVar("M", bound=nn.Module)


def materialize_tensor(
    tensor: torch.Tensor,
    device: torch.device | str | None = None,
    *,
    dtype: torch.dtype | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """The real tensor a deferred tensor stands for.

    A real tensor is returned as is; a deferred tensor always gives the same
    object (per device). Only the recorded ops it depends on are replayed.

    Args:
        tensor: a deferred (or real) tensor.
        device: where to create it; ``None`` means the device it was recorded on.
            On another kind of device, random ops draw from that device's
            generator: the values the same code gives run with ``device=``
            from the same seed (a model recorded on the CPU and materialized
            with ``device="cuda"`` gets eager CUDA's values).
        dtype: convert a floating point (or complex) result to this dtype, as
            ``t.to(dtype)`` would; other tensors keep theirs.
        threads: threads that draw a large CPU random fill, each a chunk of
            it from its own jumped generator state (same bits; see
            :mod:`torchdefer.materialize._parallel`); None: ``torch.get_num_threads()``.

    Returns:
        The real tensor, with the values eager construction would have given:
        of ``tensor``'s class (``nn.Parameter`` or a subclass of it, with the
        attributes set on it) and ``requires_grad``.

    >>> import torch, torchdefer
    >>> _ = torch.manual_seed(0); eager = torch.randn(3)
    >>> _ = torch.manual_seed(0); lazy = torchdefer.deferred_init(torch.randn, 3)
    >>> torch.equal(torchdefer.materialize_tensor(lazy), eager)
    True
    """
    check_dtype(dtype)
    threads = parallel.check_threads(threads, "materialize_tensor")
    if not isinstance(tensor, DeferredTensor):
        return cast(tensor, dtype)
    device = None if device is None else torch.device(device)
    memo = tensor.__dict__.setdefault("_materialized", {})
    key = str(device) if dtype is None else f"{device}/{dtype}"
    if key not in memo:
        raw = _materialize(tensor, device, None, threads)
        with suspended():  # inside deferred_init, the conversion is real, not recorded
            memo[key] = real_tensor(tensor, cast(raw, dtype))
    real: torch.Tensor = memo[key]
    return real


def materialize_module(
    module: M,
    device: torch.device | str | None = None,
    *,
    dtype: torch.dtype | None = None,
    buffers_only: bool = False,
    check_fn: Callable[[nn.Module], bool] | None = None,
    progress: ProgressSpec = None,
    threads: int | None = None,
) -> M:
    """Materialize the deferred tensors of ``module`` and its descendants, in place.

    That is their parameters, buffers, and tensors kept as plain attributes
    (``self.inv_freq = ...``, also in lists, tuples, dicts and sets).
    Each deferred tensor object *becomes* its real tensor: tied parameters
    stay tied (the same object), and references taken before (an optimizer's
    ``param_groups``, ``nn.LSTM``'s flat weights, a ``weakref``, a hook's
    closure) see the real tensors. Parameters keep their class (a subclass of
    ``nn.Parameter`` included) and the attributes set on them. A module
    sharded with FSDP2 ``fully_shard`` or DTensor parameters is handed to
    :func:`torchdefer.distributed.materialize_module` (each rank makes only
    its shards).

    Args:
        module: a module built by :func:`torchdefer.deferred_init`.
        device: where to create the tensors; ``None`` means each tensor's
            recorded device. Random ops then draw as the same code run with
            ``device=`` from the same seed would (CPU-recorded on ``"cuda"``:
            eager CUDA's values; see :func:`materialize_tensor`). Unlike
            torchdistX, whose second positional argument was
            ``buffers_only``; pass that by keyword.
        dtype: convert floating point tensors to this dtype, as
            ``module.to(dtype)`` would after materializing, but one tensor at
            a time: peak memory is the module in ``dtype`` plus one tensor in
            its recorded dtype. Recorded conversions (``model.half()`` after
            ``deferred_init``) are honoured the same way, tensor by tensor.
        buffers_only: materialize buffers (and tensor attributes) and leave
            parameters deferred.
        check_fn: if given, only modules for which it returns True have their
            own tensors materialized (descendants are still visited).
        progress: ``None`` shows a progress bar on stderr when it is a terminal
            and the work takes over two seconds; ``True``/``False`` always/never;
            a callable gets a :class:`~torchdefer.materialize.progress.ProgressEvent`
            per tensor instead.
        threads: threads that draw each large CPU random fill (``normal_``,
            ``uniform_`` ... of a million elements or more), each a chunk of
            it from its own jumped generator state, into the tensor, and
            that replay small independent tensors side by side
            (:mod:`torchdefer.materialize.concurrent`; ``concurrent.budget(0)``
            keeps one tensor in flight); the bits and the generator states are
            eager's (see :mod:`torchdefer.materialize._parallel`). None:
            ``torch.get_num_threads()``; 1: every call drawn whole.

    Returns:
        ``module`` itself (typed as the module you passed).

    Tensors are swapped in one at a time, in order, each converted first,
    and each replayed only after the one before was swapped in. (Side by
    side, tensors too small to split are replayed concurrently, in windows
    of consecutive tensors whose bytes fit a budget, a quarter of all of them
    or the largest tensor's if more; a failure still leaves the module as
    one at a time does.)

    Raises:
        SwapError: PyTorch refused to make a tensor real in place (C++ code
            holds a weak reference to it); the message says which and what to do.

    >>> import torch, torchdefer
    >>> m = torchdefer.deferred_init(torch.nn.Linear, 4, 4)
    >>> torchdefer.materialize_module(m, device="cpu").weight.is_meta
    False
    """
    if isinstance(device, bool):
        raise UsageTypeError(
            f"materialize_module(module, {device}): the second argument is the device. "
            "torchdistX took buffers_only there; pass it by keyword: "
            f"materialize_module(module, buffers_only={device})."
        )
    check_dtype(dtype)
    threads = parallel.check_threads(threads, "materialize_module")
    device = None if device is None else torch.device(device)
    sharded = _sharded_paths(module)
    if sharded:
        if dtype is not None:
            raise UsageTypeError(
                f"{_shown(sharded)} are sharded; dtype= is not supported for sharded modules. "
                "Convert the deferred module before sharding it (model.to(dtype) is "
                "recorded), or use FSDP2's MixedPrecisionPolicy."
            )
        with parallel.threads_used(threads):
            return _materialize_sharded(module, sharded, device, buffers_only, check_fn)
    found, grads = _deferred_reached(module, buffers_only, check_fn)
    if not found:
        return module
    # One tensor per replay, swapped in at once, in order: a later replay finds
    # the storages it shares in the cache (kept alive by the module). Small
    # independent tensors replay side by side within a memory budget
    # (materialize.concurrent); a failure leaves the module as the serial
    # order would.
    with parallel.threads_used(threads), contextlib.closing(
            _each_replayed(module, found, device, dtype, progress, _replay,
                           side_by_side=True)) as replayed:
        for name, fake, real in replayed:
            mark_replayed(target_of(fake), real)
            swap_in(fake, real, name)
    with suspended():
        for parameter, grad in grads:
            # A parameter's .grad lives on its TensorImpl, which the swap replaced.
            parameter.grad = grad
    return module


def deferred_reached(
    module: nn.Module,
) -> tuple[dict[str, DeferredTensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """What :func:`materialize_module` would make real (``{first path: tensor}``,
    each object once), and the ``(parameter, grad)`` pairs to put back after."""
    return _deferred_reached(module, False, None)


def replay_tensors(
    module: nn.Module,
    found: dict[str, DeferredTensor],
    device: torch.device | None,
    dtype: torch.dtype | None,
    progress: ProgressSpec = None,
) -> list[tuple[str, DeferredTensor, torch.Tensor]]:
    """The real tensors of ``found`` as ``materialize_module`` makes them, not swapped in.

    For callers that change a module all at once or not at all (a checkpoint
    load): ``[(path, deferred tensor, real tensor)]``. Nothing is marked
    materialized (:func:`mark_replayed` does, once swapped); a failure
    leaves every tensor deferred. The results stay alive together, so a
    later replay finds the storages it shares in the cache, as
    ``materialize_module`` finds them through the module.
    """
    with contextlib.closing(_each_replayed(module, found, device, dtype, progress,
                                           _replay, side_by_side=False)) as replayed:
        return list(replayed)


def _each_replayed(
    module: nn.Module,
    found: dict[str, DeferredTensor],
    device: torch.device | None,
    dtype: torch.dtype | None,
    progress: ProgressSpec,
    replay: Callable[[DeferredTensor, torch.device | None, str], torch.Tensor],
    *,
    side_by_side: bool,
) -> Generator[tuple[str, DeferredTensor, torch.Tensor], None, None]:
    """``(path, deferred tensor, real tensor)`` for each of ``found`` in turn, cast to
    ``dtype``, inside one call of each graph's cache and one progress bar.
    ``side_by_side``: small independent tensors replay concurrently
    (:mod:`~torchdefer.materialize.concurrent`; the results come in order)."""
    items = list(found.items())
    targets = [target_of(fake) for _, fake in items]  # one door crossing per tensor
    sizes = {name: _nbytes(target.meta, dtype) for (name, _), target in zip(items, targets)}
    threads = parallel.current_threads() if side_by_side else 1
    jobs = [_job(i, target, device, threads) for i, target in enumerate(targets)]

    def run(job: concurrent.Job) -> torch.Tensor:
        name, fake = items[job.index]
        real = replay(fake, device, name)
        with suspended():  # as in materialize_tensor
            return cast(real, dtype)

    with Progress("materialize", len(found), sum(sizes.values()), progress) as bar, \
            contextlib.ExitStack() as one_call:
        # One call of each graph's cache: a tensor computed at construction from
        # one materialized earlier in this call reads it from the cache (nothing
        # is computed twice); the user changes neither before we are done.
        for graph in {id(t.graph): t.graph for t in targets}.values():
            one_call.enter_context(cache_for(graph).call())
        for name, fake in items:  # on this thread: warnings are process-wide state
            warn_broken_ties(fake, name, module)
        with contextlib.closing(concurrent.replayed_in_order(jobs, run, threads)) as replayed:
            for job, real in replayed:
                name, fake = items[job.index]
                yield name, fake, real
                bar.advance(name, sizes[name])


def _job(index: int, target: Target, device: torch.device | None,
         threads: int) -> concurrent.Job:
    meta = target.meta
    numel = math.prod(meta.size)
    return concurrent.Job(index=index, nbytes=_nbytes(meta, None),
                          storage=(id(target.graph), target.storage.id),
                          alone=concurrent.is_alone(numel, device or meta.device, threads))


def mark_replayed(target: Target, real: torch.Tensor) -> None:
    """Record that ``target``'s storage is real now (``real``): later recorded
    writes are refused. A meta tensor has no data: nothing to refuse."""
    if not real.is_meta:
        mark_materialized(target)


def materialized_nbytes(t: DeferredTensor, dtype: torch.dtype | None) -> int:
    """The bytes ``t`` takes once real and cast to ``dtype`` (floating/complex only).

    From the recorded metadata: an UninitializedParameter refuses numel().
    """
    return _nbytes(target_of(t).meta, dtype)


def _nbytes(meta: TensorMeta, dtype: torch.dtype | None) -> int:
    numel = math.prod(meta.size)
    if dtype is not None and (meta.dtype.is_floating_point or meta.dtype.is_complex):
        return numel * dtype.itemsize
    return numel * meta.dtype.itemsize


def _deferred_reached(
    module: nn.Module, buffers_only: bool, check_fn: Callable[[nn.Module], bool] | None
) -> tuple[dict[str, DeferredTensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """What ``materialize_module`` makes real, each object once, and the grads to put back.

    Returns ``{first path: deferred tensor}`` for parameters (unless
    ``buffers_only``), their ``.grad``, buffers, and tensors kept as plain
    attributes (state like buffers; a parameter also held as an attribute
    stays a parameter), and the ``(parameter, grad)`` pairs.
    """
    reached = [r for r in reached_tensors(module, check_fn) if isinstance(r.tensor, DeferredTensor)]
    parameters = {id(r.tensor) for r in reached if r.kind == PARAMETER}
    found: dict[int, tuple[str, DeferredTensor]] = {}
    grads: list[tuple[torch.Tensor, torch.Tensor]] = []
    for r in reached:
        if buffers_only and (id(r.tensor) in parameters or r.kind == GRAD):
            continue
        found.setdefault(id(r.tensor), (r.path, r.tensor))  # type: ignore[arg-type]
        if r.kind == GRAD and r.parameter is not None:  # a grad's parameter is always set
            grads.append((r.parameter, r.tensor))
    return dict(found.values()), grads


# Modules whose parameters are sharded wrappers (DTensor, FSDP2) around
# deferred tensors go to SHARDED_MATERIALIZER: the core cannot materialize them
# (it never imports torch.distributed); the top-level package installs
# torchdefer.distributed's.
_in_sharded = threading.local()


def _sharded_paths(module: nn.Module) -> list[str]:
    return [
        r.path
        for r in reached_tensors(module)
        if not isinstance(r.tensor, DeferredTensor) and holds_deferred(r.tensor)
    ]


def _shown(paths: list[str]) -> str:
    return ", ".join(f"'{p}'" for p in paths[:3]) + (" ..." if len(paths) > 3 else "")


def _materialize_sharded(
    module: M,
    paths: list[str],
    device: torch.device | None,
    buffers_only: bool,
    check_fn: Callable[[nn.Module], bool] | None,
) -> M:
    shown = _shown(paths)
    if getattr(_in_sharded, "active", False):
        raise UsageTypeError(
            f"{shown} still wrap deferred tensors after the sharded materializer ran: a "
            "tensor subclass it does not know (it handles DTensor and FSDP2 parameters). "
            "Materialize the module before wrapping its tensors that way."
        )
    if not SHARDED_MATERIALIZER.installed:
        raise UsageTypeError(
            f"{shown} wrap deferred tensors (the module was sharded, e.g. by fully_shard "
            "or distribute_tensor), and no sharded materializer is installed. Use "
            "torchdefer.distributed.materialize_module(module)."
        )
    if device is not None or buffers_only or check_fn is not None:
        raise UsageTypeError(
            f"{shown} are sharded: they are materialized on their mesh's device, all of "
            "them. Call materialize_module(module) without device=, buffers_only= or "
            "check_fn=."
        )
    _in_sharded.active = True
    try:
        SHARDED_MATERIALIZER.get()(module)  # in place: it returns ``module`` itself
        return module
    finally:
        _in_sharded.active = False


def _materialize(fake: DeferredTensor, device: torch.device | None,
                 name: str | None, threads: int | None = None) -> torch.Tensor:
    """Replay ``fake``'s value (large fills on ``threads``); mark its storage materialized."""
    with parallel.threads_used(threads):
        real = _replay(fake, device, name)
    mark_replayed(target_of(fake), real)
    return real


def _replay(fake: DeferredTensor, device: torch.device | None, name: str | None) -> torch.Tensor:
    """Replay ``fake``'s value; mark nothing."""
    target = target_of(fake)
    with torch.inference_mode(recorded_inference(fake)):
        if (device or target.meta.device).type == "meta":
            return _on_meta(target.value, device)
        return Replay(target.graph, device).run([target.key],
                                                None if name is None else [name])[0]


def _on_meta(value: Value, device: torch.device | None) -> torch.Tensor:
    """A meta tensor as eager gives it: what ``t.to("meta")`` makes of the real
    tensor for ``device="meta"``; for a tensor recorded on meta (``with
    torch.device("meta")``), the meta kernels' own layout, storage offset and
    conjugate/negative bits, as recorded.

    Nothing is replayed: a meta tensor has no values, and random ops on meta
    draw nothing, so the generators are not involved.
    """
    meta = value.meta
    with suspended():
        if device is not None and meta.device.type != "meta":
            twin = torch.empty_strided(meta.size, meta.stride, dtype=meta.dtype, device="meta")
            return torch.empty_like(twin)  # to()'s layout rule (preserve_format), no bits
        storage = torch.UntypedStorage(value.storage.nbytes, device="meta")
        out = torch.empty(0, dtype=meta.dtype, device="meta")
        out.set_(storage, meta.offset, meta.size, meta.stride)
        out = out.conj() if meta.conj else out
        return _compat.neg_view(out) if meta.neg else out


def _read_value(fake: DeferredTensor) -> torch.Tensor:
    """A data-dependent read during recording: compute the value, mark nothing."""
    target = target_of(fake)
    device = None if device_available(target.meta.device) else torch.device("cpu")
    return Replay(target.graph, device).run([target.key])[0]


VALUE_READER.install(_read_value)
