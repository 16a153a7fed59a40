"""Refusing at the call what eager refuses there, though the meta kernels accept it.

Some checks PyTorch makes only in its real kernels, not in the meta kernels
recording runs: the dtypes a CPU kernel is compiled for (``uniform_`` on
int64: ``"check_uniform_bounds" not implemented for 'Long'``), argument
ranges checked inside the kernel (``uniform_(2, 1)``, ``random_(5, 2)``),
and TensorIterator's refusal to write a tensor whose elements share memory
(``zeros(1).expand(3).add_(1)``). Recorded anyway, such a call would fail
only at replay, far from the user's line, and a random one would have moved
the generator where eager leaves it unmoved.

So the real kernel is asked: the call is run on small real CPU *twins* of
its tensors (the same dtypes and zero strides, sizes cut to two elements a
dimension when large, valid values everywhere: 0.5, 0, False) with a private
generator and the default generator's state put back. Asked are the calls
that can hit such a check: random ops whose tensors are all on the CPU (on
another device the CPU's dtype support proves nothing, so only the device's
own replay can tell), and any call writing a tensor with internal overlap
(a zero stride over more than one element: the only overlap eager detects),
for which only the overlap refusal counts. Verdicts are cached per call
signature, so a model's thousand ``normal_(0, 0.02)`` calls ask once.

Random ops whose twins are cut down to two elements a dimension are asked
all the same when their kernel-only checks are of scalar arguments only
(``uniform_(2, 1)`` on a large tensor: ``_SIZE_FREE``).

Checks on the data: ``multinomial`` and ``poisson`` check their tensor's
values before drawing, and recording cannot count their draws, so leaving
``deferred_init`` runs them on those values anyway. Their inputs' values are
read at the call instead (a data read, as ``.item()`` is) and eager asked with
them: a negative probability is refused at the call, the generator unmoved.
Random ops whose draws are counted (``normal`` with a tensor ``std``,
``bernoulli`` with a tensor ``p``) are not read: an invalid value is refused
when the op is replayed, naming the call (``ReplayError``).

A call the meta kernel refuses on CPU tensors (shapes that do not match) is
refused with eager's message where it differs (``mm``: "mat1 and mat2 shapes
cannot be multiplied", not the meta kernel's "a and b must have same
reduction dim"): ``eager_error``.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn.parameter import is_lazy
from torch.utils._pytree import tree_leaves

from torchdefer._compat import DisableTorchFunctionSubclass, OpOverload
from torchdefer._compat.generator import get_state
from torchdefer._hooks import VALUE_READER
from torchdefer.errors import EagerRefusalError
from torchdefer.fake._grad import on_twins
from torchdefer.recorder._ambient import current_ambient
from torchdefer.recorder._mode import suspended

__all__ = ["EagerRefusalError", "dtypes_unasked", "eager_error", "eager_refuses",
           "lacks_version_counter", "note_counterless_views", "rare_dtypes", "refuse_as_eager",
           "writes_inference"]

_OVERLAP = "more than one element of the written-to tensor refers to a single memory location"
_PARTIAL = "some elements of the input tensor and the written-to tensor refer to a single memory"
_SMALL = 1 << 16  # twins up to this many elements keep their sizes
_CPU = torch.device("cpu")
_UNKNOWN = object()
_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device})
_aten = torch.ops.aten
# Random ops whose kernel-only checks are of scalar arguments and dtypes, never
# of sizes: a refusal of twins cut to two elements a dimension is the call's.
_SIZE_FREE = frozenset({
    _aten.uniform_, _aten.uniform, _aten.normal_, _aten.normal, _aten.bernoulli_,
    _aten.bernoulli, _aten.random_, _aten.random, _aten.exponential_, _aten.exponential,
    _aten.geometric_, _aten.geometric, _aten.cauchy_, _aten.cauchy, _aten.log_normal_,
    _aten.log_normal, _aten.randint, _aten.randint_like, _aten.rand, _aten.randn,
    _aten.rand_like, _aten.randn_like,
})
# Random ops whose CPU kernels check their tensor's values before drawing and
# whose draws recording runs rather than counts (see the module docstring).
_DATA_CHECKED = frozenset({_aten.multinomial, _aten.poisson})


_verdicts: dict[Any, tuple[type[BaseException], str] | None] = {}
_combined: dict[type[BaseException], type[EagerRefusalError]] = {}


def refuse_as_eager(func: Any, args: tuple, kwargs: dict, written: list[torch.Tensor],
                    random: bool, where: Callable[[], str]) -> None:
    """Raise what eager raises for ``func(*args, **kwargs)``, if it is one of the
    checks only real kernels make (see the module docstring); else return.

    ``written``: the tensors the call writes in place; ``where()``: the user's line.
    """
    with DisableTorchFunctionSubclass():  # plain metadata reads of deferred tensors
        if _plain_init(func, args, kwargs, written):
            return
        refusal = _refusal(func, args, kwargs, written, random)
    if refusal is not None:
        kind, message = refusal
        name = getattr(func, "__name__", None) or str(func)
        raise _combined_type(kind)(
            f"{name} at {where()}: eager PyTorch refuses this call ({kind.__name__}: "
            f"{message}), so it is not recorded, and the random generators did not move. "
            "Fix the call as you would for eager code."
        )


def eager_refuses(fn: Any, args: tuple, kwargs: dict, written: list[torch.Tensor],
                  random: bool) -> bool:
    """Whether eager raises somewhere inside the Python function ``fn`` (a composite).

    Such a call is recorded op by op instead, so that each op is refused where
    eager refuses it, after the draws eager made before it. An inference
    tensor written outside inference mode is one: eager's kernel draws and
    writes, then autograd refuses the inference tensor, and recorded op by op
    the same happens.
    """
    with DisableTorchFunctionSubclass():
        if any(t.is_inference() for t in written) and not torch.is_inference_mode_enabled():
            return True
        return _refusal(fn, args, kwargs, written, random) is not None


# Views, taken outside inference mode, of inference tensors: eager makes them
# without a version counter, so a write to one is refused; a deferred view's own
# TensorImpl has a counter. id -> weak reference (a WeakSet would compare
# tensors with ==, elementwise).
_COUNTERLESS: dict[int, weakref.ref] = {}


def lacks_version_counter(t: Any) -> bool:
    """Whether eager's tensor for ``t`` keeps no version counter, so that a write to
    it outside inference mode is refused (after the kernel ran): a tensor made in
    inference mode, or a view of one (:func:`note_counterless_views`). ``detach()``,
    ``.data`` and dtype views outside inference mode get a counter of their own,
    in eager and on the fake tensor alike."""
    ref = _COUNTERLESS.get(id(t))
    return (ref is not None and ref() is t) or _keeps_no_counter(t)


def _keeps_no_counter(t: torch.Tensor) -> bool:
    with DisableTorchFunctionSubclass():
        try:
            _ = t._version
        except RuntimeError:  # "Inference tensors do not track version counter"
            return True
    return False


def note_counterless_views(func: Any, args: tuple, kwargs: dict, inputs: Sequence[Any],
                           outputs: Sequence[Any]) -> None:
    """Remember the outputs of a view op (``func``, outside inference mode) that share
    the storage of an inference tensor and, as eager's, keep no version counter
    (also of ``t.data``, an inference tensor with a counter of its own).

    Eager's kernel decides, run on meta twins (an inference tensor's twin made
    in inference mode): ``view(shape)``, ``t()`` and slicing keep no counter,
    ``view(dtype)`` and ``view_as_real`` make one (fuzz seed 20261225: a write
    through ``inference.view(torch.uint8)`` was refused where eager writes).
    """
    if func is _aten.detach.default or not writes_inference(inputs):
        return  # detach makes a counter; storages made outside inference mode have one
    with DisableTorchFunctionSubclass():
        bare = {id(x._value.storage) for x in inputs if x.is_inference()}
    if not bare or not _eager_view_keeps_no_counter(func, args, kwargs):
        return
    taken = {id(x) for x in inputs}
    for o in outputs:
        if hasattr(o, "_value") and id(o) not in taken and id(o._value.storage) in bare:
            _COUNTERLESS[id(o)] = weakref.ref(o, functools.partial(_forget, id(o)))


def _eager_view_keeps_no_counter(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``func`` outside inference mode, given inference tensors where the call
    has them, returns a tensor without a version counter (True where it cannot tell:
    a write to it is then refused, never let through)."""
    try:
        out = on_twins(func, args, kwargs)
    except Exception:  # the twins cannot run it: keep the stricter answer
        return True
    return any(_keeps_no_counter(o) for o in tree_leaves(out) if isinstance(o, torch.Tensor))


def _forget(key: int, _: weakref.ref) -> None:
    _COUNTERLESS.pop(key, None)


def writes_inference(written: Sequence[Any]) -> bool:
    """Whether a call writes an inference tensor (outside inference mode, autograd
    refuses it after the kernel ran: see ``recorder._ambient.in_inference_mode``).

    Read from the recording, without a torch call: a deferred tensor is an
    inference tensor when its storage was made under inference mode.
    """
    for t in written:
        ambient = t._value.storage.creator.ambient
        if ambient is not None and ambient.inference:
            return True
    return False


def _refusal(func: Any, args: tuple, kwargs: dict, written: list[torch.Tensor],
             random: bool) -> tuple[type[BaseException], str] | None:
    if any(_device(t).type == "meta" for t in written):
        return None  # eager runs the same meta kernels there: nothing more to ask
    overlapping = any(_overlaps(t) for t in written)
    if written and len(args) + len(kwargs) > 1 and _partly_shared(written, args, kwargs):
        verdict = _ask_eager(func, args, kwargs, shared=True)
        if verdict is not None and (_PARTIAL in verdict[1] or _OVERLAP in verdict[1]):
            return verdict
    if not random and not overlapping:
        return _dtype_gap(func, args, kwargs)
    if not overlapping and _surely_fine(func, args, kwargs):
        return None
    on_cpu = all(_device(t) == _CPU for t in _tensors(args, kwargs)) and _cpu_arg(kwargs)
    if on_cpu and getattr(func, "overloadpacket", None) in _DATA_CHECKED:
        verdict = _ask_with_data(func, args, kwargs)
        if verdict is not None:
            return verdict
    if not overlapping and not on_cpu:
        return None
    verdict = _verdict(func, args, kwargs)
    if verdict is None or not ((random and on_cpu) or _OVERLAP in verdict[1]):
        return None
    return verdict


# Dtypes for which CPU kernels often lack an implementation (``addmm`` on bool,
# ``sort`` on complex): a call reading one is asked of eager. Inputs only: the
# common float and int64 tensors never pay for the question.
_RARE = frozenset({torch.bool, torch.complex32, torch.complex64, torch.complex128, torch.int8,
                   torch.uint8, torch.int16, torch.uint16, torch.uint32, torch.uint64})


def rare_dtypes(inputs: list[Any]) -> bool:
    """Whether a recorded call's inputs (graph values) hold a dtype of ``_RARE``."""
    return any(v.meta.dtype in _RARE for v in inputs)


def dtypes_unasked(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether eager must be asked whether its CPU kernel has this call's dtypes.

    On the common dtypes the answer depends on the op, its tensors' dtypes and
    its other arguments' types only (``hypot`` on int64, ``bitwise_and`` on
    float16, ``gelu`` on int64: "not implemented for 'Long'"): asked once per
    such signature, and again only where the answer was a refusal.
    """
    if not isinstance(func, OpOverload):
        return False  # a user's composite: its ops are asked, not the function run on twins
    key = _gap_key(func, args, kwargs)
    return key is not None and _gap_verdicts.get(key, _UNKNOWN) is not None


def _gap_key(func: Any, args: tuple, kwargs: dict) -> Any:
    """``(func, dtypes of the tensors, the rest)``; None without tensors.

    Plain arguments but floats by value (``pow(t, -1)`` of an int tensor is
    refused, ``pow(t, 2)`` not), others by type: a model's many scales and
    stds do not each make a question.
    """
    dtypes = tuple(t.dtype for t in _tensors(args, kwargs))
    if not dtypes:
        return None
    rest = tuple((type(x), x if type(x) in _BY_VALUE else None)
                 for x in (*args, *kwargs.values()) if not isinstance(x, torch.Tensor))
    return func, dtypes, rest, tuple(kwargs)


def _dtype_gap(func: Any, args: tuple, kwargs: dict) -> tuple[type[BaseException], str] | None:
    """Eager's "not implemented for <dtype>" for a CPU call, the only refusal of a
    deterministic call its twins prove (no size, value or layout causes it), and
    a pointwise kernel's refusal of its dtypes or scalar arguments."""
    tensors = list(_tensors(args, kwargs))
    if not tensors or not _cpu_arg(kwargs) or not all(_device(t) == _CPU for t in tensors):
        return None
    if any(is_lazy(t) for t in tensors):
        return None  # an uninitialized parameter has no shape to ask with
    if any(t.dtype in _RARE for t in tensors) or (
            isinstance(func, OpOverload) and any(t.numel() == 0 for t in tensors)):
        # by shape: on empty tensors some kernels return before they dispatch on the dtype
        verdict = _verdict(func, args, kwargs)
    elif not isinstance(func, OpOverload):
        return None  # a user's composite on common dtypes: its ops are asked as recorded
    else:
        key = _gap_key(func, args, kwargs)
        verdict = _gap_verdicts.get(key, _UNKNOWN)
        if verdict is _UNKNOWN:
            verdict = _gap_verdicts[key] = _ask_eager(func, args, kwargs)
    if verdict is None:
        return None
    if issubclass(verdict[0], NotImplementedError) or _pointwise(func):
        # A pointwise kernel's other checks are of dtypes and scalar arguments too
        # (relu of bool, maximum of complex, mul_ of bool by int64): both fills
        # of the twins refused, so no tensor value caused it; twins cut to two
        # elements a dimension never count here (_run_twins drops their
        # RuntimeErrors: cut apart, shapes that broadcast may no longer).
        return verdict
    return None


def _pointwise(func: Any) -> bool:
    return isinstance(func, OpOverload) and torch.Tag.pointwise in func.tags


_BY_VALUE = _PLAIN - {float}
# Verdicts on the common dtypes, by _gap_key: None (the kernel has them) or eager's error.
_gap_verdicts: dict[Any, Any] = {}


# The two init workhorses, on the dtypes every device's kernel has: answered
# without asking (they are most of a model's random calls).
_NORMAL_ = torch.ops.aten.normal_.default
_UNIFORM_ = torch.ops.aten.uniform_.default
_FLOATS = {d: torch.finfo(d).max for d in (torch.float16, torch.bfloat16, torch.float32,
                                           torch.float64)}


def _surely_fine(func: Any, args: tuple, kwargs: dict) -> bool:
    if func is not _NORMAL_ and func is not _UNIFORM_:
        return False
    limit = _FLOATS.get(args[0].dtype)  # uniform_ refuses bounds and ranges beyond it
    if limit is None:
        return False
    first, second = ("mean", "std") if func is _NORMAL_ else ("from", "to")
    a = args[1] if len(args) > 1 else kwargs.get(first, 0.0)
    b = args[2] if len(args) > 2 else kwargs.get(second, 1.0)
    # No all(genexpr): this runs for most of a model's random calls.
    if type(a) not in _NUMBERS or type(b) not in _NUMBERS or abs(a) > limit or abs(b) > limit:
        return False
    return b >= 0 if func is _NORMAL_ else a <= b and b - a <= limit


_NUMBERS = (int, float)


def _plain_init(func: Any, args: tuple, kwargs: dict, written: list[torch.Tensor]) -> bool:
    """Whether ``_refusal`` surely answers None without asking eager: ``normal_`` or
    ``uniform_`` surely fine (``_surely_fine``) on a tensor without internal
    overlap, with no other tensor argument that could share its memory.

    The same answer as ``_refusal``'s, in a fraction of its time: these two
    ops are most of a model's random calls (1124 of the 70B Llama's 2748 ops).
    """
    if (func is not _NORMAL_ and func is not _UNIFORM_) or len(written) != 1:
        return False
    self = args[0]
    if written[0] is not self:
        return False
    for x in args[1:]:
        if isinstance(x, torch.Tensor):
            return False
    for x in kwargs.values():
        if isinstance(x, torch.Tensor):
            return False
    for n, st in zip(self.shape, self.stride()):
        if st == 0 and n > 1:  # internal overlap: eager refuses the write
            return False
    return _surely_fine(func, args, kwargs)


def _overlaps(t: torch.Tensor) -> bool:
    return any(n > 1 and s == 0 for n, s in zip(t.shape, t.stride()))


def _partly_shared(written: list[torch.Tensor], args: tuple, kwargs: dict) -> bool:
    """Whether a written tensor and another argument overlap in part, as eager's
    ``get_overlap_status`` (ATen/MemoryOverlap.cpp) sees it: both dense, in one
    storage, their byte ranges meeting without being the same tensor."""
    for w in written:
        for x in _tensors(args, kwargs):
            if x is w or not hasattr(x, "_value"):
                continue
            # Written tensors are deferred ones (recorder.record): w has a _value.
            if x._value.storage is not w._value.storage:  # type: ignore[attr-defined]
                continue
            if _partial(w, x):
                return True
    return False


def _partial(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    if not (_dense(a) and _dense(b)):
        return False  # "too hard": eager does not check
    a_begin, b_begin = a.storage_offset() * a.itemsize, b.storage_offset() * b.itemsize
    a_end, b_end = a_begin + a.numel() * a.itemsize, b_begin + b.numel() * b.itemsize
    if (a_begin, a_end) == (b_begin, b_end):
        return a.stride() != b.stride()
    return a_begin < b_end and b_begin < a_end


def _dense(t: torch.Tensor) -> bool:
    """c10's ``compute_non_overlapping_and_dense``: some order of the dimensions
    of more than one element makes the strides contiguous."""
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n >= 2)
    expected = 1
    for st, n in dims:
        if st != expected:
            return False
        expected *= n
    return True


def _shared_twins(args: tuple, kwargs: dict, second: bool = False,
                  ) -> dict[int, torch.Tensor] | None:
    """Twins of the deferred arguments over one real base per recorded storage,
    with their real offsets and strides, or None when a storage is large or
    viewed as several dtypes."""
    groups: dict[int, list[torch.Tensor]] = {}
    for x in _tensors(args, kwargs):
        if hasattr(x, "_value"):
            groups.setdefault(id(x._value.storage), []).append(x)
    twins = {}
    for group in groups.values():
        if len({x.dtype for x in group}) > 1:
            return None
        extent = max(x.storage_offset() + 1 + sum((n - 1) * st for n, st in zip(x.shape,
                     x.stride())) if x.numel() else 0 for x in group)
        if extent > _SMALL:
            return None
        base = torch.full((extent,), _fill(group[0], second), dtype=group[0].dtype,
                          device=_CPU)
        for x in group:
            twins[id(x)] = base.as_strided(x.shape, x.stride(), x.storage_offset())
    return twins


def _device(t: torch.Tensor) -> torch.device:
    return getattr(t, "fake_device", None) or t.device


def _cpu_arg(kwargs: dict) -> bool:
    device = kwargs.get("device")
    return device is None or torch.device(device).type == "cpu"


def _tensors(args: tuple, kwargs: dict):
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            yield from (y for y in x if isinstance(y, torch.Tensor))


def _verdict(func: Any, args: tuple, kwargs: dict) -> tuple[type[BaseException], str] | None:
    key = _key(func, args, kwargs)
    try:
        verdict = _verdicts.get(key, _UNKNOWN)
    except TypeError:  # an unhashable argument: asked every time
        return _ask_eager(func, args, kwargs)
    if verdict is _UNKNOWN:
        verdict = _verdicts[key] = _ask_eager(func, args, kwargs)
    return verdict  # type: ignore[return-value]


def _key(func: Any, args: tuple, kwargs: dict) -> Any:
    seen: dict[int, int] = {}

    def part(x: Any) -> Any:
        if type(x) in _PLAIN:
            return x
        if isinstance(x, torch.Tensor):  # what its twin is made from, and which one it is
            return (x.dtype, x.shape, x.stride(), seen.setdefault(id(x), len(seen)))
        if isinstance(x, torch.Generator):
            return "G"
        if isinstance(x, (list, tuple)):
            return tuple(part(y) for y in x)
        return x

    # Ambients are interned (one object per setting): its id is its identity.
    return (func, id(current_ambient()), part(args),
            tuple((k, part(v)) for k, v in kwargs.items()))


def _ask_eager(func: Any, args: tuple, kwargs: dict, shared: bool = False,
               ) -> tuple[type[BaseException], str] | None:
    """Run the call on twins; the error eager gives, or None.

    Twins cut to two elements a dimension may fail where the real sizes do
    not (``multinomial`` of more samples than two categories): from those
    only the errors no size can cause count, a dtype a kernel lacks and the
    overlap refusal.
    """
    verdict = _run_twins(func, args, kwargs, shared, second=False)
    if verdict is None or not any(True for _ in _tensors(args, kwargs)):
        return verdict
    # The twins' values stand in for data recording does not have; a refusal
    # that other values avoid (`randint_like(t, high)` with a tensor `high`
    # of 0) is the data's, not the call's: only refusals both fills get count.
    return verdict if _run_twins(func, args, kwargs, shared, second=True) else None


def _run_twins(func: Any, args: tuple, kwargs: dict, shared: bool, second: bool,
               ) -> tuple[type[BaseException], str] | None:
    with suspended(), torch.no_grad():
        saved = get_state(torch.default_generator)  # as it is: a marker stays one
        try:
            twins = _shared_twins(args, kwargs, second) if shared else {}
            if twins is None:
                return None
            # One twin per tensor: `t.copy_(t)` is no overlap to eager (the same tensor).
            twin_args = _shrink_sizes(func, tuple(_twin(x, None, twins, second) for x in args))
            twin_kwargs = {k: _twin(v, k, twins, second) for k, v in kwargs.items()}
            func(*twin_args, **twin_kwargs)
        except Exception as error:  # whatever eager raises is the verdict
            message = (str(error).strip().splitlines() or [""])[0]
            cut = _was_cut(args, kwargs, func)
            size_free = getattr(func, "overloadpacket", None) in _SIZE_FREE
            if cut and not size_free and not isinstance(error, NotImplementedError) and (
                    _OVERLAP not in message):
                return None
            return type(error), message
        finally:
            torch.default_generator.set_state(saved)
    return None


def _ask_with_data(func: Any, args: tuple, kwargs: dict,
                   ) -> tuple[type[BaseException], str] | None:
    """Run the call on its tensors' real values (read, not recorded) with a private
    generator; the error eager gives, or None."""
    def real(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and hasattr(x, "_value"):
            return VALUE_READER.get()(x)
        if isinstance(x, torch.Generator):
            return torch.Generator(device=_CPU).manual_seed(0)
        return x

    real_args = tuple(real(x) for x in args)
    real_kwargs = {k: real(v) for k, v in kwargs.items()}
    if "generator" not in real_kwargs and not any(
            isinstance(x, torch.Generator) for x in real_args):
        real_kwargs["generator"] = torch.Generator(device=_CPU).manual_seed(0)
    with suspended(), torch.no_grad():
        try:
            func(*real_args, **real_kwargs)
        except Exception as error:  # whatever eager raises is the verdict
            return type(error), (str(error).strip().splitlines() or [""])[0]
    return None


def eager_error(func: Any, args: tuple, kwargs: dict, error: Exception,
                where: Callable[[], str]) -> Exception | None:
    """What eager raises for a call whose meta kernel raised ``error``, where its
    message differs: asked of twins of the call's CPU tensors (small ones only,
    at their own sizes, so the message is eager's word for word), or None."""
    with DisableTorchFunctionSubclass():
        tensors = list(_tensors(args, kwargs))
        if not all(_device(t) == _CPU for t in tensors) or not _cpu_arg(kwargs):
            return None
        if any(math.prod(t.shape) > _SMALL for t in tensors):
            return None
        verdict = _run_twins(func, args, kwargs, shared=False, second=False)
    if verdict is None or not isinstance(error, verdict[0]) or verdict[1] in str(error):
        return None
    kind, message = verdict
    name = getattr(func, "__name__", None) or str(func)
    return _combined_type(kind)(f"{name} at {where()}: {kind.__name__}: {message}")


def _was_cut(args: tuple, kwargs: dict, func: Any) -> bool:
    if any(math.prod(t.shape) > _SMALL for t in _tensors(args, kwargs)):
        return True
    sizes = [kwargs.get("size")]
    schema = getattr(func, "_schema", None)
    if schema is not None:
        sizes += [x for a, x in zip(schema.arguments, args) if a.name == "size"]
    return any(_small_size(size) is not size for size in sizes)


def _twin_layout(t: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Sizes (cut to 2 a dimension when large) and strides: zero where ``t``'s are."""
    sizes = tuple(t.shape)
    if math.prod(sizes) > _SMALL:
        sizes = tuple(min(n, 2) for n in sizes)
    strides, step = [0] * len(sizes), 1
    for i in reversed(range(len(sizes))):
        if t.stride()[i] != 0 or sizes[i] <= 1:
            strides[i] = step
            step *= max(sizes[i], 1)
    return sizes, tuple(strides)


def _twin(x: Any, name: str | None, twins: dict[int, torch.Tensor], second: bool = False) -> Any:
    """A real CPU stand-in for argument ``x`` (the one made before for the same tensor)."""
    if isinstance(x, torch.Tensor):
        if id(x) not in twins:
            sizes, strides = _twin_layout(x)
            extent = 1 + sum((n - 1) * s for n, s in zip(sizes, strides)) if all(sizes) else 0
            base = torch.full((extent,), _fill(x, second), dtype=x.dtype, device=_CPU)
            twins[id(x)] = base.as_strided(sizes, strides)
        return twins[id(x)]
    if isinstance(x, torch.Generator):
        return torch.Generator(device=_CPU).manual_seed(0)
    if isinstance(x, (list, tuple)) and any(isinstance(y, torch.Tensor) for y in x):
        return type(x)(_twin(y, None, twins, second) for y in x)
    if name == "size":
        return _small_size(x)
    if name == "device" and x is not None:
        return _CPU
    return x


def _fill(x: torch.Tensor, second: bool = False) -> Any:
    """A value valid everywhere: a probability, a mean, a std, an index (``second``:
    another such value, to tell refusals of the values from refusals of the call)."""
    if x.dtype == torch.bool:
        return second
    if x.is_floating_point() or x.is_complex():
        return 0.25 if second else 0.5
    return 1 if second else 0


def _small_size(size: Any) -> Any:
    if isinstance(size, (list, tuple)) and all(isinstance(n, int) for n in size):
        if math.prod(size) > _SMALL:
            return type(size)(min(n, 2) for n in size)
    return size


def _shrink_sizes(func: Any, args: tuple) -> tuple:
    """A positional ``size`` argument (``randn([8192, 8192])``) cut like a twin's."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return args
    names = [a.name for a in schema.arguments]
    return tuple(_small_size(x) if i < len(names) and names[i] == "size" else x
                 for i, x in enumerate(args))


def _combined_type(kind: type[BaseException]) -> type[EagerRefusalError]:
    if issubclass(kind, EagerRefusalError) or not issubclass(kind, Exception):
        return EagerRefusalError
    combined = _combined.get(kind)
    if combined is None:
        try:
            combined = type(kind.__name__, (EagerRefusalError, kind), {})
        except TypeError:  # an instance layout that clashes with RuntimeError's
            combined = EagerRefusalError
        _combined[kind] = combined
    return combined
