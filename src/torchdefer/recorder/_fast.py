"""The ops that make up most of a model's construction, recorded in one step.

``normal_``, ``uniform_`` and ``fill_`` on a floating-point deferred tensor
with plain number arguments, ``detach`` (every ``nn.Parameter(t)``) and
``empty``/``ones``/``zeros`` of plain sizes are nearly all the ops a large
model's ``__init__`` records (2733 of the 70B Llama's 2748). ``record_call``
answers them after a dozen general steps (flattening, schema walks, write and
resize plans, the refusal questions, output wrapping); here, once the
arguments are seen to be of the plain form, the node is built directly, with
exactly the fields the general path gives it
(``tests/recorder/test_fast_paths.py`` records the same programs both ways
and compares the graphs field by field).

What is deliberately *not* here: fills with a tensor or generator argument,
keyword arguments, other dtypes, meta tensors, overlapping strides,
out-of-range numbers, writes into inference tensors; factories with other
keywords (``layout``, ``pin_memory=True``, ``memory_format``). Those return
:data:`SLOW`, and the general path, with its checks and PyTorch's own errors,
answers them. The meta kernel still makes a factory's or a detach's output,
and ``rng._ledger`` still places each random call.

The fast paths are called by the recording mode (``_mode.RecordingMode``, through
``ENTRIES.fast_ops``) and by ``record_call``; ``above`` counts the frames of
library code from their caller up (the mode's dispatch,
``_mode.DISPATCH_FRAMES``; ``record_call`` and its caller's): the user's line
is looked for past them, unwalked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from torchdefer import _compat
from torchdefer.fake._state import STATE
from torchdefer.fake._tensor import FakeTensor, factory_on_meta
from torchdefer.recorder._entries import SLOW
from torchdefer.recorder._graph import Graph, NodeKind, TensorMeta, Value
from torchdefer.recorder._refusals import writes_inference
from torchdefer.recorder._storage_versions import write
from torchdefer.recorder._tensor import DATA_GET_CALL, DeferredTensor

__all__ = ["FAST_OPS", "SLOW", "fast_detach", "fast_factory", "fast_fill"]

_NORMAL_ = torch.ops.aten.normal_.default
_UNIFORM_ = torch.ops.aten.uniform_.default
_FILL_ = torch.ops.aten.fill_.Scalar
_DETACH = torch.ops.aten.detach.default
_TENSOR_DETACH = _compat.TensorBase.detach
# NodeKind's members, read once: on Python 3.11 a member lookup costs ~0.1 µs
# (EnumType.__getattr__), and these are read for every recorded op.
_RANDOM, _INPLACE, _VIEW, _DATA_GET, _FACTORY = (
    NodeKind.RANDOM, NodeKind.INPLACE, NodeKind.VIEW, NodeKind.DATA_GET, NodeKind.FACTORY)
# DeferredTensor(elem, device) for a meta ``elem`` and a device: what its ``__new__``
# calls then, one Python call fewer (object.__init__ does nothing).
_new_fake = cast(Callable[[type, torch.Tensor, torch.device], DeferredTensor], FakeTensor.__new__)
# Largest finite value per dtype: uniform_ refuses bounds beyond it, fill_
# refuses values it cannot convert.
_LIMITS = {d: torch.finfo(d).max for d in (torch.float16, torch.bfloat16, torch.float32,
                                           torch.float64)}
# flatten_call's spec of (self, *numbers) with no keywords, by number of arguments.
_SPECS = {n: (n, (), (None,) * n) for n in range(1, 4)}


def fast_fill(graph: Graph, func: Any, args: tuple, kwargs: dict, above: int) -> Any:
    """Record ``func(*args)`` (a fill of ``FAST_OPS``) as ``record_call`` would; else SLOW."""
    if kwargs or not _plain(func, args, graph):
        return SLOW
    self = args[0]
    value = self._value
    storage = value.storage
    if writes_inference((self,)):  # eager writes, then refuses: the general path's case
        return SLOW
    leaves = [value, *args[1:]]
    kind = _INPLACE if func is _FILL_ else _RANDOM
    node = graph.add_node(kind, func, leaves, _SPECS[len(args)], (value,), (storage.version,),
                          skip=2 + above)  # 2: the caller
    node.writes = (write(node, storage),)
    # In place, metadata untouched: the same object holds a new value.
    self._value = Value(node, 0, storage, value.meta)
    node.outputs.append(self._value)
    if kind is _RANDOM:
        graph.rng.place_plain(node, self.fake_device, _draw_key(func, args, value.meta))
    return self


def _draw_key(func: Any, args: tuple, meta: TensorMeta) -> tuple[Any, ...]:
    """All that decides a plain random fill's draws (``recorder._rng_placement._signature``'s
    fields but the numbers), flat.

    The numbers (``normal_``'s mean and std, ``uniform_``'s bounds) choose no
    code path (``rng.draws._PATH_FREE``; checked by
    ``tests/recorder/test_fast_paths.py``): left out, so that layers of
    different std share one answer. The arity stays (the spec follows from it).
    """
    return (id(func), len(args), meta.size, meta.stride, meta.dtype)


def _plain(func: Any, args: tuple, graph: Graph) -> bool:
    """Whether the call is of the plain form (see the module docstring)."""
    n = len(args)
    if n > (2 if func is _FILL_ else 3) or (func is _FILL_ and n != 2):
        return False
    self = args[0]
    if getattr(self, "_graph", None) is not graph:
        return False
    meta = self._value.meta
    limit = _LIMITS.get(meta.dtype)
    if limit is None or meta.device.type == "meta" or meta.conj or meta.neg:
        return False
    if 0 in meta.stride:  # rare: the pairwise walk only then (zip allocates, per fill)
        for size, stride in zip(meta.size, meta.stride):
            if stride == 0 and size > 1:  # internal overlap: eager refuses the write
                return False
    for x in args[1:]:
        if (type(x) is not float and type(x) is not int) or not abs(x) <= limit:
            return False
    if func is _NORMAL_:
        return n < 3 or args[2] >= 0
    if func is _UNIFORM_:
        low = args[1] if n > 1 else 0.0
        high = args[2] if n > 2 else 1.0
        return low <= high and high - low <= limit
    return True


def fast_detach(graph: Graph, func: Any, args: tuple, kwargs: dict, above: int) -> Any:
    """Record ``detach`` of a deferred tensor of ``graph`` (every ``nn.Parameter(t)``
    detaches ``t``) as ``record_call`` would: a view with the input's metadata."""
    self = args[0] if len(args) == 1 and not kwargs else None
    if self is None or getattr(self, "_graph", None) is not graph:
        return SLOW
    value = self._value
    device = self.fake_device
    elem = _on_meta(func, self)
    # `t.data` reaches the dispatcher as this detach (recorder.tensor marks it).
    kind = _DATA_GET if DATA_GET_CALL.active else _VIEW
    node = graph.add_node(kind, func, [value], _SPECS[1], (value,), (value.storage.version,),
                          skip=2 + above)  # 2: the caller
    out = _new_fake(DeferredTensor, elem, device)
    out._graph = graph
    # An alias of the whole input, conj and neg bits kept: its metadata is the input's.
    meta = value.meta
    if meta.device != device:  # set together (`.data = x` moves both); the kernel's rule else
        meta = TensorMeta.of(elem, device)
    out._value = Value(node, 0, value.storage, meta)
    node.outputs.append(out._value)
    return out


def _on_meta(func: Any, t: torch.Tensor) -> torch.Tensor:
    """``func(t)`` on the meta kernel, for an op of one fake tensor argument
    whose output layout is the kernel's (what ``fake.run_on_meta`` does for it).

    ``detach`` goes through the tensor method's binding: the same aten op, where
    an OpOverload call matches its arguments against the schema (~4 µs more,
    once per parameter); with no ``__torch_function__`` (of the subclass or a
    mode) on the way.
    """
    previous = _compat.meta_in_tls_dispatch_include()
    STATE.in_kernel = True
    _compat.set_meta_in_tls_dispatch_include(True)
    try:
        if func is _DETACH:
            with _compat.DisableTorchDispatch(), _compat.DisableTorchFunction():
                return _TENSOR_DETACH(t)
        with _compat.DisableTorchDispatch():
            return func(t)
    finally:
        STATE.in_kernel = False
        _compat.set_meta_in_tls_dispatch_include(previous)


_FACTORY_KEYS = frozenset({"dtype", "device", "pin_memory"})


def fast_factory(graph: Graph, func: Any, args: tuple, kwargs: dict, above: int) -> Any:
    """Record ``empty``/``ones``/``zeros`` of a list of sizes as ``record_call`` would.

    Only the keywords a plain ``torch.empty(*sizes, dtype=, device=)`` passes
    (``pin_memory=False``); the meta kernel still makes the output
    (``fake.factory_on_meta``: ``run_on_meta``'s device rule, through the op's
    Python binding).
    """
    if len(args) != 1 or type(args[0]) is not list or not kwargs.keys() <= _FACTORY_KEYS:
        return SLOW
    if kwargs.get("pin_memory") is not False:
        return SLOW
    sizes = args[0]
    for n in sizes:
        if type(n) is not int:
            return SLOW
    try:
        out, device = factory_on_meta(func, sizes, kwargs)
    except Exception:  # nothing recorded yet: the general path raises it,
        return SLOW  # in eager's words where they differ (record.eager_error)
    leaves = [*sizes, *kwargs.values()]
    keys = tuple(kwargs)
    if kwargs.get("dtype") is None:  # "the default dtype now": recorded as the dtype it gave
        if "dtype" in keys:
            leaves[len(sizes) + keys.index("dtype")] = out.dtype
        else:
            leaves.append(out.dtype)
            keys = (*keys, "dtype")
    node = graph.add_node(_FACTORY, func, leaves, _factory_spec(len(sizes), keys), (), (),
                          skip=2 + above)  # 2: the caller
    fake = _new_fake(DeferredTensor, out, device)
    # A fresh contiguous output's storage is its elements; asking the storage
    # (untyped_storage()) would make a Python object that lives as long as it.
    storage = graph.new_storage(node, out.nbytes)
    graph.holders[_compat.storage_id(fake)] = fake
    fake._graph = graph
    fake._value = Value(node, 0, storage, TensorMeta.of(out, device))
    node.outputs.append(fake._value)
    return fake


# (number of sizes, keywords) -> flatten_call's spec of (sizes, **keywords). Shared
# by the nodes of one form: a spec holds the type `list`, so each copy would be
# three more objects the cyclic GC tracks, per factory call.
_factory_specs: dict[tuple[int, tuple[str, ...]], tuple[Any, ...]] = {}


def _factory_spec(n: int, keys: tuple[str, ...]) -> tuple[Any, ...]:
    spec = _factory_specs.get((n, keys))
    if spec is None:  # few forms: a model's tensors have few ranks
        spec = _factory_specs[(n, keys)] = (1, keys, ((list, n),) + (None,) * len(keys))
    return spec


FAST_OPS: dict[int, Any] = {
    **{id(f): fast_fill for f in (_NORMAL_, _UNIFORM_, _FILL_)},
    **{id(f): fast_factory for f in (torch.ops.aten.empty.memory_format,
                                     torch.ops.aten.ones.default, torch.ops.aten.zeros.default)},
    id(torch.ops.aten.detach.default): fast_detach,
}
"""``id(op overload)`` -> its one-step recorder (OpOverload's hash is Python: by id)."""
