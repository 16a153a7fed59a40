"""Recording one op call on deferred tensors into the graph."""

from __future__ import annotations

from typing import Any

import torch

from torchdefer import _compat
from torchdefer._hooks import VALUE_READER
from torchdefer.errors import RecordingError, TorchdeferError
from torchdefer.fake._layout import meta_twin
from torchdefer.fake._output_device import output_device
from torchdefer.fake._pinned import check_pinning, lifted_is_pinned
from torchdefer.fake._source import user_frame
from torchdefer.fake._tensor import run_on_meta
from torchdefer.recorder._alias import overlapping_write, schema_values, writes_of
from torchdefer.recorder._ambient import current_ambient, in_inference_mode
from torchdefer.recorder._args import flatten_call, flatten_out, unflatten_call
from torchdefer.recorder._collectives import refuse_collective
from torchdefer.recorder._facts import BOOL_INDEX, OpFacts, facts_of
from torchdefer.recorder._fast import FAST_OPS, SLOW
from torchdefer.recorder._graph import Graph, Node, NodeKind, Storage, TensorMeta, Value
from torchdefer.recorder._mode import suspended
from torchdefer.recorder._nodes import (
    as_deferred,
    external,
    new_output,
    record_writes,
    where,
    written_tensors,
)
from torchdefer.recorder._refusals import (
    dtypes_unasked,
    eager_error,
    lacks_version_counter,
    note_counterless_views,
    rare_dtypes,
    refuse_as_eager,
    writes_inference,
)
from torchdefer.recorder._storage_versions import (
    StorageArgs,
    is_storage,
    owner_of,
    record_growth,
    resizable_by,
)
from torchdefer.recorder._tensor import DeferredTensor

__all__ = ["data_read", "record_call", "record_constant", "record_data_set", "record_general"]

_LIFT = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)
_TO = torch.ops.aten.to
_PIN_MEMORY = torch.ops.aten._pin_memory.default
# NodeKind's members, read once: on Python 3.11 a member lookup costs ~0.1 µs
# (EnumType.__getattr__), and these are read for every recorded op.
_RANDOM, _INPLACE, _VIEW, _FACTORY, _CALL = (
    NodeKind.RANDOM, NodeKind.INPLACE, NodeKind.VIEW, NodeKind.FACTORY, NodeKind.CALL)


def record_call(graph: Graph, func: Any, args: tuple, kwargs: dict, above: int = 0) -> Any:
    """Run ``func`` on meta, record it as a node, return deferred outputs.

    ``above``: Python frames of library code known to sit from the caller up
    (jumped over unwalked where the user's line is looked for).
    """
    fast = FAST_OPS.get(id(func))  # the plain fills, in one step (recorder/_fast.py)
    if fast is not None:
        out = fast(graph, func, args, kwargs, above + 1)  # + 1: this frame
        if out is not SLOW:
            return out
    return record_general(graph, func, args, kwargs)


def record_general(graph: Graph, func: Any, args: tuple, kwargs: dict) -> Any:
    """What :func:`record_call` does past its one-step recorders: any op, through its
    facts (the recording mode calls it for the calls those refuse)."""
    # reshape, flatten, movedim... in inference mode: eager decomposes them below
    # autograd, and their views of a normal tensor follow its requires_grad.
    decomposed = _compat.decomposed_in_inference(func, args, kwargs)
    if decomposed is not None:
        return decomposed
    facts = facts_of(func)
    if facts.special:
        if facts.collective:
            refuse_collective(func)
        return _special_op(graph, func, args, kwargs)
    plan = facts.plan
    flat, spec = flatten_call(args, kwargs)
    leaves = list(flat)
    inputs: list[Value] = []
    reads: list[int] = []
    owners: list[DeferredTensor] = []  # of storage arguments
    tensors: list[DeferredTensor] = []  # the tensor arguments, as flat_tensors gives them
    replaced = False  # an argument stands in for another object (external, storage)
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor):
            if not isinstance(x, DeferredTensor) or x._graph is not graph:
                x = flat[i] = as_deferred(graph, x, func)
                replaced = True
            tensors.append(x)
        elif plan.takes_storage and is_storage(x):
            x = as_deferred(graph, owner_of(x, graph, func, where(2)), func)
            owners.append(x)
        else:
            continue
        value = x._value
        inputs.append(value)
        reads.append(value.storage.version)
        leaves[i] = value
    if replaced:
        args, kwargs = unflatten_call(flat, spec)
    pinned = False
    if kwargs:
        _check_arguments(func, kwargs, tensors)
        pinned = bool(kwargs.get("pin_memory"))
        if pinned:  # checked: meta kernels and eager's probes need not pin (replay pins)
            kwargs = {**kwargs, "pin_memory": False}
    if facts.needs_data and _needs_data(facts, flat):
        return _computed_from_data(graph, func, flat, spec, kwargs, inputs)
    if facts.question:  # a bool/int about metadata: nothing to replay
        return run_on_meta(func, args, kwargs)[0]
    writes: tuple[int, ...] = ()
    written: list[Any] = []
    if plan.writes or plan.hidden:
        written = schema_values(plan, args, kwargs)
        writes = writes_of(plan, written)
        # new outputs computed while writing, or a hidden write in force
        if writes and (plan.fresh_returns or len(writes) > len(plan.writes)):
            _refuse_overlapping_write(func, plan, written, writes)
    targets: list[Any] = list(written_tensors(written, writes)) if writes else []
    before = {id(t): _storage_id(t) for t in targets} if targets else _NO_STORAGES
    # normal_/uniform_ answered without running anything (most of a model's
    # writes): their tensor's metadata and storage stay as they are.
    filled = _fill_in_place(func, args, written) if targets else None
    # Only a write (an out= argument, resize_, set_) can grow a storage.
    resizable = resizable_by(plan, tensors + owners, targets) if targets and not filled else []
    sizes = {id(t): _storage_id(t) for t in resizable}
    generator = _generator_in(facts, args, kwargs) if facts.generators else None
    random = facts.random or generator is not None
    if targets or random or rare_dtypes(inputs) or dtypes_unasked(func, args, kwargs):
        # kernel-only checks, asked of eager
        refuse_as_eager(func, args, kwargs, targets, random, where)
    try:
        out, device = filled or run_on_meta(func, args, _without_generator(kwargs), tensors)
    except (NotImplementedError, _compat.DynamicOutputShapeException) as e:
        raise _unrecordable(func, e) from e
    except RuntimeError as e:
        # Shape errors and the like are the user's and read as in eager code;
        # these messages mean the op has no way to run without data.
        if not isinstance(e, TorchdeferError) and any(sign in str(e) for sign in _NO_META_SIGNS):
            raise _unrecordable(func, e) from e
        eager = eager_error(func, args, kwargs, e, where)  # eager's words, if they differ
        if eager is not None:
            raise eager from e
        raise
    if facts.takes_dtype and kwargs.get("dtype") is None and isinstance(out, torch.Tensor):
        # No dtype means "the default dtype now": replay must not depend on the
        # default at replay time (HF sets it while building, then restores it).
        leaves, spec = _with_dtype(leaves, spec, out.dtype)
    op = StorageArgs(func) if owners else func
    ambient = current_ambient()
    inference = ambient.inference
    refused = False
    if targets and not inference and writes_inference(targets):
        ambient = in_inference_mode(ambient)  # eager writes, then (maybe) refuses
        refused = any(lacks_version_counter(t) for t in targets)
    outputs = _Outputs(out, tensors + owners if owners else tensors, before)
    kind = _kind(facts, bool(targets), outputs.aliased, not inputs, device)
    if (generator is not None or facts.untagged) and device.type != "meta":
        # An op that takes a generator draws from it, tagged random or not; an
        # op of another library may draw from a default generator untagged:
        # placing it in that stream (its end reached by running it) keeps the
        # stream and the values right either way.
        kind = _RANDOM
    node = graph.add_node(kind, op, leaves, spec, tuple(inputs), tuple(reads), ambient=ambient)
    if writes:
        node.writes = record_writes(node, written, writes)
    if resizable:
        node.writes += record_growth(node, resizable, sizes)
    out = outputs.wrap(graph, node, device, same_meta=filled is not None)
    if outputs.aliased and not inference:
        note_counterless_views(func, args, kwargs, tensors, outputs.outs)
    if pinned or func is _PIN_MEMORY:
        for value in node.outputs:
            value.storage.pinned = True  # a new storage: eager's is page-locked
    if kind is _RANDOM:
        graph.rng.place(node, generator, device)
    if refused:
        # Eager refuses the write after the kernel ran: the tensor keeps no
        # version counter. A deferred view's own TensorImpl has one (a view taken
        # outside inference mode of an inference tensor), so the refusal is made here.
        raise RuntimeError(_INFERENCE_WRITE)
    return out


_INFERENCE_WRITE = (
    "Inplace update to inference tensor outside InferenceMode is not allowed.You can make a "
    "clone to get a normal tensor before doing inplace update.See "
    "https://github.com/pytorch/rfcs/pull/17 for more details."
)


def _refuse_overlapping_write(func: Any, plan: Any, values: list[Any],
                              writes: tuple[int, ...]) -> None:
    """Refuse a call that writes memory another of its arguments reads while it
    computes (``recorder._alias.overlapping_write``)."""
    pair = overlapping_write(plan, values, writes)
    if pair is None:
        return
    written, read = pair
    stats = written in ("running_mean", "running_var")
    why = " (batch norm updates its running statistics in training mode)" if stats else ""
    raise RecordingError(
        f"{func} at {where(1)} writes its argument '{written}' in place{why} while "
        f"reading its argument '{read}', which shares memory with it. Eager's result "
        "then depends on the order in which the kernel reads and writes that memory, "
        "which deferred replay does not reproduce, so the call is not recorded. Pass "
        f"tensors that share no memory with '{written}' (.clone() one of them)."
    )


def _special_op(graph: Graph, func: Any, args: tuple, kwargs: dict) -> Any:
    """The ops that are not simply recorded (``OpFacts.special``)."""
    if func.overloadpacket is _TO:
        # Reaches dispatch undecomposed only for inference tensors (no autograd
        # key); its device argument may be positional: decomposed as eager does.
        return func.decompose(*args, **kwargs)
    if func in _LIFT:
        if isinstance(args[0], DeferredTensor):  # torch.tensor lifts twice
            return args[0]
        if not args[0].untyped_storage().resizable():
            # Memory torch does not own (from_numpy, as_tensor, frombuffer): eager
            # tensors alias it and see later writes, so reference it, checked at
            # replay, rather than copy it.
            return external(graph, args[0])
        out = record_constant(graph, args[0])
        if lifted_is_pinned(args[0]):  # torch.tensor(data, pin_memory=True): eager's is
            out._value.storage.pinned = True
        return out
    # _ITEM, the one op left (see _facts._SPECIAL)
    if not isinstance(args[0], DeferredTensor):  # a real scalar read by torch itself
        return func(*args, **kwargs)
    return data_read(torch.Tensor.item, args, kwargs)


def _with_dtype(leaves: list[Any], spec: Any, dtype: torch.dtype) -> tuple[list[Any], Any]:
    """The flattened call with ``dtype=dtype`` (what re-flattening the call with that
    keyword set gives: a present keyword keeps its place, a new one goes last)."""
    n_args, keys, shape = spec
    if "dtype" not in keys:
        return [*leaves, dtype], (n_args, (*keys, "dtype"), (*shape, None))
    at = n_args + keys.index("dtype")
    leaves = list(leaves)
    leaves[sum(1 if s is None else s[1] for s in shape[:at])] = dtype
    return leaves, spec


def _generator_in(facts: OpFacts, args: tuple, kwargs: dict) -> torch.Generator | None:
    """The generator a call draws from explicitly: one passed in a Generator argument."""
    n_args = len(args)
    for i, name in facts.generators:
        value = args[i] if i < n_args else kwargs.get(name)
        if value is None:
            continue
        for x in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(x, torch.Generator):
                return x
    return None


def _without_generator(kwargs: dict) -> dict:
    """Meta kernels draw nothing; some (the Python refs of ``exponential_``,
    ``geometric_``, ``cauchy_``, ``log_normal_``) refuse a generator outright."""
    if kwargs.get("generator") is None:
        return kwargs
    return {**kwargs, "generator": None}


_NO_META_SIGNS = ("Meta", "meta", "fake impl", "fake kernel", "data-dependent")

_NORMAL_ = torch.ops.aten.normal_.default
_UNIFORM_ = torch.ops.aten.uniform_.default


def _fill_in_place(func: Any, args: tuple, values: list[Any]) -> tuple[Any, torch.device] | None:
    """The two init workhorses, without their (slow, Python) meta kernels.

    On meta, ``normal_`` and ``uniform_`` change nothing but check their
    arguments; the checks are repeated here and anything unusual takes the
    ordinary path so that its error is PyTorch's own. ``values``: the call's
    arguments in schema order (``schema_values``, which ``record_call`` made).
    """
    if func is not _NORMAL_ and func is not _UNIFORM_:
        return None
    self = args[0]
    if not isinstance(self, DeferredTensor) or not self.is_floating_point():
        return None
    if func is _NORMAL_:
        ok = values[2] is None or values[2] >= 0
    else:
        ok = values[1] is None or values[2] is None or values[1] <= values[2]
    return (self, self.fake_device) if ok else None


def _needs_data(facts: OpFacts, flat: list[Any]) -> bool:
    if facts.needs_data == BOOL_INDEX:  # boolean-mask indexing is nonzero in disguise
        return any(
            isinstance(x, torch.Tensor) and x.dtype in (torch.bool, torch.uint8) for x in flat[1:]
        )
    return True


def _computed_from_data(graph: Graph, func: Any, flat: list[Any], spec, kwargs: dict, inputs):
    """Run a data-dependent op on the materialized inputs; keep the result as constants."""
    device = output_device(kwargs, [x for x in flat if isinstance(x, torch.Tensor)])
    real = [VALUE_READER.get()(x) if isinstance(x, DeferredTensor) else x for x in flat]
    real_args, real_kwargs = unflatten_call(real, spec)
    with suspended():
        out = func(*real_args, **real_kwargs)
    leaves = [x._value if isinstance(x, DeferredTensor) else x for x in flat]
    node = graph.add_node(NodeKind.OBSERVE, func, leaves, spec, tuple(inputs),
                          tuple(v.storage.version for v in inputs), skip=3, runs_kernel=False)
    outs = [record_constant(graph, o, device) if isinstance(o, torch.Tensor) else o
            for o in flatten_out(out)]
    node.payload = None if any(isinstance(o, torch.Tensor) for o in outs) else out
    if isinstance(out, torch.Tensor) or out is None or not isinstance(out, (tuple, list)):
        return outs[0]
    return type(out)(outs)


def _kind(facts: OpFacts, writes: bool, aliased: bool, factory: bool,
          device: torch.device) -> NodeKind:
    if facts.random and device.type != "meta":
        return _RANDOM
    if writes:
        return _INPLACE
    if aliased:
        return _VIEW
    if factory:
        return _FACTORY
    return _CALL


def record_constant(
    graph: Graph, real: torch.Tensor, device: torch.device | None = None
) -> DeferredTensor:
    """A tensor built from Python data (``torch.tensor``), kept by value.

    ``device`` is the device the fake reports when it differs from the real
    one (a value computed on the CPU for a fake CUDA tensor).
    """
    # Its ambient: under inference mode, an inference tensor, as in eager.
    node = graph.add_node(NodeKind.CONSTANT, None, [], None, (), ())
    with suspended():  # called from Python too (from_numpy), mode active
        node.payload = real.detach().clone()
        elem = meta_twin(real)
    return new_output(graph, node, 0, elem, device or real.device, None)


class _Outputs:
    """An op's outputs, seen before its node is made (whether one aliases an
    input decides the node's kind), then given their values (:meth:`wrap`).

    An output aliases an input exactly when it shares that input's (meta)
    storage: meta kernels alias as the real ones do, whatever the schema says
    (``split`` returns ``Tensor(a)[]``, ``unsafe_split`` and ``_unsafe_view``
    carry no annotation, ``set_`` moves its target onto another storage).
    ``inputs``: the deferred tensors among the arguments (storage owners too);
    ``before`` maps each tensor the op writes to its storage before the call.
    """

    __slots__ = ("_before", "aliased", "in_ids", "keys", "out", "outs", "storages")

    def __init__(self, out: Any, inputs: list[DeferredTensor], before: dict[int, int]) -> None:
        self.out = out
        self.outs = outs = flatten_out(out)
        # storage id -> record, for the inputs not returned in place (their
        # storage may have changed under them); wrap() adds the new storages.
        self.storages: dict[int, Storage] = {}
        self.in_ids: set[int] | frozenset[int] = _NO_IDS
        if inputs:
            out_ids = {id(o) for o in outs}
            for x in inputs:
                if id(x) not in out_ids:
                    self.storages[_storage_id(x)] = x._value.storage
            self.in_ids = {id(x) for x in inputs}
        # Each tensor output's storage id; an output aliases when its storage is
        # an input's or an earlier output's (what wrap() finds in `storages`).
        self.keys: list[int | None] = []
        seen = set(self.storages)
        aliased = False
        for o in outs:
            if not isinstance(o, torch.Tensor):
                self.keys.append(None)
                continue
            key = _storage_id(o)
            self.keys.append(key)
            if id(o) in self.in_ids and isinstance(o, DeferredTensor):
                aliased = True
                if key not in seen and key != before.get(id(o), key):
                    seen.add(key)  # moved onto a new storage (set_)
                continue
            aliased = aliased or key in seen
            seen.add(key)
        self.aliased = aliased
        self._before = before

    def wrap(self, graph: Graph, node: Node, device: torch.device, same_meta: bool) -> Any:
        """Attach values of ``node`` to the outputs, wrapping new ones.

        ``same_meta``: nothing ran on the tensors, so their metadata is as recorded.
        """
        outs, storages, before = self.outs, self.storages, self._before
        for k, o in enumerate(outs):
            key = self.keys[k]
            if key is None:
                continue
            storage = storages.get(key)
            if id(o) in self.in_ids and isinstance(o, DeferredTensor):
                # In place: the same object, now a new value (its metadata may have
                # changed, as with t_(); its storage too, as with set_()).
                if storage is None and key == before.get(id(o), key):
                    storage = o._value.storage
                elif storage is None:
                    storage = storages[key] = graph.new_storage(node, _nbytes(o))
                    graph.holders[key] = o
                if same_meta:
                    meta = o._value.meta  # immutable: shared with the value before
                else:
                    with _compat.DisableTorchFunctionSubclass():  # plain metadata reads
                        meta = TensorMeta.of(o, o.fake_device)
                o._value = Value(node, k, storage, meta)
                node.outputs.append(o._value)
                continue
            outs[k] = new_output(graph, node, k, o, device, storage)
            storages.setdefault(key, outs[k]._value.storage)
        out = self.out
        if isinstance(out, torch.Tensor) or out is None:
            return outs[0]
        return type(out)(outs)


_NO_IDS: frozenset[int] = frozenset()
_NO_STORAGES: dict[int, int] = {}  # read only


def _nbytes(t: torch.Tensor) -> int:
    with _compat.DisableTorchFunctionSubclass():
        return t.untyped_storage().nbytes()


# The storage's address; a fake tensor's storage is its meta storage.
_storage_id = _compat.storage_id


def _check_arguments(func: Any, kwargs: dict, tensors: list) -> None:
    layout = kwargs.get("layout")
    if layout is not None and layout != torch.strided:
        raise RecordingError(
            f"{func} asks for layout={layout}; deferred_init records strided tensors "
            f"only (called at {where()}). Create the tensor dense and convert it after "
            "materialization."
        )
    if kwargs.get("pin_memory"):  # t.pin_memory() is checked by its fake kernel
        device = output_device(kwargs, tensors)
        check_pinning(f"{func}(pin_memory=True)", device, factory=True)


def _unrecordable(func: Any, error: BaseException) -> RecordingError:
    return RecordingError(
        f"{func} cannot be recorded: it has no meta implementation, or its output shape "
        f"depends on data (called at {where()}). Compute it after materialization, or "
        f"replace it with ops that have meta kernels. Original error: {error}"
    )


def data_read(func: Any, args: tuple, kwargs: dict) -> Any:
    """Answer ``.item()``, ``.tolist()``, ``bool(t)`` ... by materializing just that value."""
    fake = args[0]
    real = VALUE_READER.get()(fake)
    # numpy() detaches internally: with the recording mode on, that detach
    # would be recorded and the array would read a fake tensor's memory.
    with suspended(), _compat.DisableTorchFunctionSubclass():
        if func in (torch.Tensor.numpy, torch.Tensor.__array__):
            real = _own_copy(real, fake.requires_grad)
        result = func(real, *args[1:], **kwargs)
    graph = fake._graph
    node = graph.add_node(NodeKind.OBSERVE, func, [fake._value], None, (fake._value,),
                          (fake._value.storage.version,), runs_kernel=False)
    node.payload = result if not isinstance(result, torch.Tensor) else None
    return result


def _own_copy(real: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """``real`` with its sizes, strides (zero strides of ``expand()`` too) and
    conjugate/negative bits in memory of its own: the bytes its elements span,
    copied; ``requires_grad`` as the deferred tensor's, so numpy() refuses as
    eager does.

    An array over the replayed tensor itself would keep that storage alive in
    the replay cache, where later recorded writes would land in it. Strides
    matter: numpy's reductions follow them, so a compact copy sums in another
    order than eager's array over the tensor.
    """
    conj, neg = real.is_conj(), real.is_neg()
    physical = _compat.neg_view(real) if neg else real  # the bits toggle off, data untouched
    physical = physical.conj() if conj else physical
    sizes, strides = real.shape, real.stride()
    span = 1 + sum((n - 1) * s for n, s in zip(sizes, strides)) if real.numel() else 0
    with torch.no_grad():
        own = physical.as_strided((span,), (1,)).clone().as_strided(sizes, strides)
    own = own.conj() if conj else own
    own = _compat.neg_view(own) if neg else own
    return own.requires_grad_() if requires_grad else own


def record_data_set(target: torch.Tensor, new: torch.Tensor) -> None:
    """``target.data = new``: the tensor object now holds ``new``'s value."""
    if not isinstance(target, DeferredTensor):
        return _data_set_of_real(target, new)
    graph = target._graph
    new = as_deferred(graph, new, "Tensor.data.__set__")
    node = graph.add_node(NodeKind.DATA_SET, None, [new._value], None, (new._value,),
                          (new._value.storage.version,), runs_kernel=False)
    with _compat.DisableTorchFunctionSubclass():
        _compat.descriptor_set(_compat.TensorBase, "data")(target, new)
    target.fake_device = new.fake_device
    target._value = Value(node, 0, new._value.storage, new._value.meta)
    node.outputs.append(target._value)


def _data_set_of_real(target: torch.Tensor, new: torch.Tensor) -> None:
    """``real.data = deferred``. A meta tensor (``torch.tensor(data)`` under a meta
    device is one, as in eager) takes ``new``'s metadata: neither has values.
    Any other real tensor would hold values nothing has computed yet: refused."""
    if target.is_meta and new.device.type == "meta":
        if isinstance(new, DeferredTensor):
            meta, nbytes = new._value.meta, new._value.storage.nbytes
        else:  # a fake tensor of fake_mode
            meta, nbytes = TensorMeta.of(new, new.device), new.untyped_storage().nbytes()
        with suspended(), _compat.DisableTorchFunctionSubclass():
            storage = torch.UntypedStorage(nbytes, device="meta")
            twin = torch.empty(0, dtype=meta.dtype, device="meta")
            twin.set_(storage, meta.offset, meta.size, meta.stride)
            _compat.descriptor_set(_compat.TensorBase, "data")(target, twin)
        return
    frame = user_frame(2)
    at = f" at {frame.file}:{frame.line}" if frame else ""
    raise RecordingError(
        f"Tensor.data.__set__{at} sets the data of a real tensor (one created outside "
        "deferred_init, or one materialize_tensor/materialize_module returned) to a deferred "
        "tensor, whose values are not computed yet. Materialize it first "
        "(real.data = torchdefer.materialize_tensor(t)), or create the target inside "
        "deferred_init."
    )
