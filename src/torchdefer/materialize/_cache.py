"""What materialization keeps between calls, per graph: real storages.

The caches live here, not on the graph (which knows nothing of replay): one
:class:`ReplayCache` per recorded graph, held while the graph lives
(:func:`cache_for`). A cache names storages and values by their numbers in
the graph (``Storage.id``, a value's node and output index), never by the
objects, so it does not keep the graph alive: a graph whose tensors were all
materialized is freed, its cache with it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from torchdefer import _compat
from torchdefer.errors import ReplayError
from torchdefer.materialize._derive import ValueKey, same_elements, through_views, value_key
from torchdefer.recorder._graph import Graph, NodeKind, TensorMeta, Value

__all__ = ["ReplayCache", "cache_for", "keep_loaded", "rebuild"]


@dataclass(frozen=True, slots=True)
class _Entry:
    ref: StorageWeakRef
    version: int
    # value_key(value) -> the layout it really had, for every value of the
    # storage the replay that made it computed: views of the storage rebuilt
    # later get eager's strides even where the meta kernels' differ.
    layouts: dict[ValueKey, TensorMeta]
    call: int  # the materialization call that stored it (ReplayCache.call)


class ReplayCache:
    """Real storages already produced, held weakly.

    Storages are held through ``StorageWeakRef`` so a materialized tensor the
    user drops is freed; while it lives, tensors that shared its storage in
    eager code are rebuilt as views of it (shared storage stays shared). Only
    a storage's current version is answered, and external tensors' storages
    are never kept (each replay reads those through their change check).

    A materialized storage is the user's tensor once the call that made it
    returns: a training step may change it, through ``.data`` or ``set_`` too,
    which no version counter sees. So it answers two questions differently.
    As the tensor a target *is* (the target or a view of it), always: eager
    views see every later change. As the *contents* a recorded op read, only
    within the materialization call that stored it (``call()``: no user code
    runs until it returns, and nothing is computed twice there); a later
    call replays that input from what construction gave.

    A value the replay computed is rebuilt with the layout it really had. Any
    other view is rebuilt from its recorded sizes and strides, which are the
    meta kernels'. Where a replayed tensor of the storage came out with another
    layout than recorded (a kernel whose layout the meta kernel does not know,
    or a tensor recorded on CUDA replayed on the CPU), those cannot be trusted:
    such a view is taken again from its base, as eager took it
    (``_derive.through_views``). Where no chain of views leads to a value of
    known layout, it is rebuilt from the recorded layout if every difference
    was in dimensions of size 1 (the same elements), else replayed from
    scratch when only its contents are wanted, and refused when it is wanted
    as a view of the user's tensor (a copy would not see the user's writes).

    Thread-safe: ``materialize_module(threads=N)`` replays independent tensors
    on several threads at once, each looking up and storing here; one lock
    guards every read and write of the tables (held for dictionary work only,
    never while a tensor is computed).
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        # (Storage.id, device key) -> what is cached of it
        self._storages: dict[tuple[int, str], _Entry] = {}
        # (Storage.id, device key) -> whether every replayed layout that differed
        # from the recorded one still addressed the same elements
        self._diverged: dict[tuple[int, str], bool] = {}
        # Storage.id of each storage whose tensor was replaced by a loaded one that
        # is not all of it as recorded (keep_loaded), so its views cannot be placed
        self._replaced: set[int] = set()
        self._call = 0  # materialization calls begun
        self._depth = 0  # calls running now, nested ones included

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """One materialization call: the user's code does not run until it returns,
        so what it stores answers reads of contents until then. Nested calls
        (a replay a replay needs) are part of the outer one."""
        with self._lock:
            if not self._depth:
                self._call += 1
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1

    def lookup(
        self, value: Value, version: int, device_key: str, *, alias: bool = False,
    ) -> torch.Tensor | None:
        """``value`` at ``version`` over its cached real storage, or None to replay it.

        ``alias``: the tensor is wanted as what a target is (eager's view of
        the user's tensor, changes included), not as contents a recorded op read.
        """
        with self._lock:
            return self._lookup(value, version, device_key, alias)

    def _lookup(
        self, value: Value, version: int, device_key: str, alias: bool,
    ) -> torch.Tensor | None:
        if alias and value.storage.id in self._replaced:
            raise ReplayError(
                f"The tensor of shape {value.meta.size} recorded at {value.node.where()} "
                "shares its storage with a tensor a checkpoint load replaced by one of "
                "another dtype or layout (torchdefer.load_state_dict with dtype=, or a "
                "parameter that is part of a bigger storage), so it cannot be rebuilt over "
                "the loaded values as eager's view would show them. Take the view from the "
                "loaded module again, or materialize it before loading."
            )
        key = (value.storage.id, device_key)
        entry = self._storages.get(key)
        # Only the storage's current contents: an older version still alive (a
        # data read's tensor someone holds) must not become the input that a
        # later write is replayed into while the storage is rebuilt beside it.
        if (entry is None or entry.version != version or version != value.storage.version
                or entry.ref.expired()):
            return None
        if not alias and value.storage.materialized and entry.call != self._call:
            return None  # the user's since its call returned: maybe changed
        storage = torch.UntypedStorage._new_with_weak_ptr(entry.ref.cdata)
        known = entry.layouts.get(value_key(value))
        if known is not None:
            return rebuild(known, storage)
        diverged = self._diverged.get(key)
        if diverged is None:
            return rebuild(value.meta, storage)
        real = through_views(value, entry.layouts, lambda meta: rebuild(meta, storage))
        if real is not None:
            return real
        if diverged:  # only size-1 strides differed: the recorded layout is right
            return rebuild(value.meta, storage)
        if alias:
            raise ReplayError(
                f"The tensor of shape {value.meta.size} recorded at {value.node.where()} "
                "shares its storage with a tensor materialized earlier, which replay laid "
                "out otherwise than recording saw (a kernel whose output strides the meta "
                f"kernel does not know), and {value.node.name} does not take it from that "
                "tensor by views alone, so it cannot be rebuilt as eager's view of it. "
                "Materialize both in one call (materialize_module, or materialize the "
                "view first), or clone() the view while building if sharing is not needed."
            )
        return None

    def store(
        self,
        value: Value,
        version: int,
        device_key: str,
        real: torch.Tensor,
        layouts: dict[int, tuple[Value, TensorMeta]] | None = None,
    ) -> None:
        """Keep ``real``'s storage; ``layouts``: real layouts of the storage's values seen.

        Not the storage of an external tensor: that is the user's memory, which
        can change without a version bump (the numpy array behind
        ``from_numpy``), so each replay reads it through its change check.
        """
        if value.storage.creator.kind == NodeKind.EXTERNAL:
            return
        ref = StorageWeakRef(real.untyped_storage())
        known = {value_key(v): meta for v, meta in (layouts or {}).values()}
        known[value_key(value)] = TensorMeta.of(real, real.device)
        with self._lock:
            self._storages[(value.storage.id, device_key)] = _Entry(ref, version, known,
                                                                    self._call)

    def check_layout(self, value: Value, real: Any, device_key: str) -> None:
        """Note when a replayed tensor's layout differs from the recorded one."""
        if not isinstance(real, torch.Tensor):
            return
        meta = value.meta
        if real.stride() == meta.stride and real.storage_offset() == meta.offset:
            return
        key = (value.storage.id, device_key)
        kept = same_elements(TensorMeta.of(real, real.device), meta)
        with self._lock:
            self._diverged[key] = kept and self._diverged.get(key, True)


def rebuild(meta: TensorMeta, storage: torch.UntypedStorage) -> torch.Tensor:
    """The tensor ``meta`` describes, over ``storage``: sizes, strides, offset, lazy bits.

    On the storage's device: a tensor recorded on meta stays there whatever
    ``device=`` a replay was given (``Replay.map_device``).
    """
    out = torch.empty(0, dtype=meta.dtype, device=storage.device)
    out.set_(storage, meta.offset, meta.size, meta.stride)
    if meta.conj:
        out = out.conj()
    if meta.neg:
        out = _compat.neg_view(out)
    return out


def cache_for(graph: Graph) -> ReplayCache:
    """The replay cache of ``graph``, made at its first materialization.

    Threads materialize at once (``materialize._parallel``): the first two
    asking for a graph's cache must get the same one.
    """
    cache = _caches.get(graph)
    if cache is None:
        with _caches_lock:
            cache = _caches.get(graph)
            if cache is None:
                cache = _caches[graph] = ReplayCache()
    return cache


# Weak keys: a graph's cache lives as long as the graph (it holds nothing of
# the graph's, see the module docstring).
_caches: weakref.WeakKeyDictionary[Graph, ReplayCache] = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def keep_loaded(value: Value, real: torch.Tensor) -> Callable[[], None]:
    """Keep ``real`` (a loaded checkpoint tensor now standing for ``value``) as its
    storage, so deferred views of it (``row = m.weight[0]`` held outside the
    module) are rebuilt over the loaded values, as eager views see what
    ``Module.load_state_dict`` copied in. Only where ``real`` is all of the
    recorded storage, laid out as recorded; otherwise such views are refused
    (``lookup``) rather than replayed from construction.

    Returns what undoes it (a load rolled back: the tensor is deferred again,
    and ``real`` may live on in the caller's state dict).
    """
    graph = value.node.graph
    if graph is None:
        return _nothing
    cache, sid = cache_for(graph), value.storage.id
    keys = _loaded_keys(value, real)
    with cache._lock:
        before = {k: cache._storages.get((sid, k)) for k in keys}
        replaced = sid in cache._replaced
        if keys:
            first, *others = keys
            cache.store(value, value.storage.version, first, real)
            kept = cache._storages.get((sid, first))  # None: an external storage, never kept
            if kept is not None:
                for key in others:
                    cache._storages[(sid, key)] = kept  # frozen, layouts never change: shared
        else:
            cache._replaced.add(sid)

    def undo() -> None:
        with cache._lock:
            for key, entry in before.items():
                if entry is None:
                    cache._storages.pop((sid, key), None)
                else:
                    cache._storages[(sid, key)] = entry
            if not replaced:
                cache._replaced.discard(sid)

    return undo


def _nothing() -> None:
    pass


def _loaded_keys(value: Value, real: torch.Tensor) -> set[str]:
    """The device keys a loaded tensor is kept under; none where it cannot stand
    for the recorded storage (another dtype or layout, or part of it)."""
    meta = value.meta
    if (real.dtype != meta.dtype or real.stride() != meta.stride
            or meta.offset != 0 or real.storage_offset() != 0
            or real.untyped_storage().nbytes() != value.storage.nbytes):
        return set()
    # Under the keys of a later materialize_tensor(view): without device= (if
    # loaded where it was recorded), with the device named either way.
    keys = {str(real.device)}
    if real.device.index in (None, 0):
        keys.add(real.device.type)
    if real.device == meta.device:
        keys.add("recorded")
    return keys
