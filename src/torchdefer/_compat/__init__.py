"""The one place for private or version-sensitive PyTorch APIs.

torchdefer supports every torch from the floor in ``pyproject.toml`` to the
newest release (docs/VERSIONS.md has what each gave). Code elsewhere calls
the helpers here instead of reaching into ``torch._*`` or branching on the
torch version, so a torch upgrade that moves or fixes something is one edit
in this file. Each shim detects the feature, not the version number, and says
which releases need it, so it can be dropped when the floor passes them.

The bindings below are plain aliases (no wrapper: several sit on the
per-op hot path); ``export.py`` holds the ones only the descriptors use
(torch.export's serializer, ShapeEnv, dynamo); ``generator.py`` sees every read
of a generator's state while a recording runs. Outside this package the code
uses no ``torch._*`` name; ``tests/test_compat.py`` checks that by parsing
every module. The exceptions are the two documented extension points
``torch.utils._pytree`` and ``TorchDispatchMode``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import _meta_registrations as meta_registrations
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.utils._python_dispatch import _disable_current_modes as disable_current_modes
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = [
    "AMBIENT_GETTERS",
    "BCOMPLEX32",
    "CONV_MEMORY_FORMAT",
    "FAKE_MODE_KEY",
    "DisableTorchDispatch",
    "DisableTorchFunction",
    "DisableTorchFunctionSubclass",
    "DynamicOutputShapeException",
    "NormBase",
    "OpOverload",
    "TensorBase",
    "decomposed_in_inference",
    "default_device_context",
    "descriptor_get",
    "descriptor_set",
    "disable_current_modes",
    "dispatch_modes_active",
    "dispatch_wrapper_frames",
    "fsdp1_init_utils",
    "get_dispatch_mode",
    "hash_tensor",
    "import_dynamo",
    "is_traceable_wrapper_subclass",
    "meta_in_tls_dispatch_include",
    "meta_registrations",
    "neg_view",
    "only_lift_cpu_tensors",
    "parse_to",
    "philox_table_applies",
    "restore_default_device",
    "set_dispatch_mode",
    "set_meta_in_tls_dispatch_include",
    "set_only_lift_cpu_tensors",
    "skip_dynamo_disable_when_not_compiling",
    "storage_id",
    "swap_tensor_impl",
    "torch_function_mode_enabled",
    "unset_dispatch_mode",
]

# ---- torch._C bindings (stable across 2.8-2.15) ---------------------------------

TensorBase = torch._C.TensorBase
"""The C tensor class: its slot descriptors (``is_leaf``, ``data``) skip ``__torch_function__``."""
DisableTorchFunctionSubclass = torch._C.DisableTorchFunctionSubclass
DisableTorchDispatch = torch._C._DisableTorchDispatch
DisableTorchFunction = torch._C.DisableTorchFunction
"""No ``__torch_function__`` at all inside, of subclasses or modes."""
FAKE_MODE_KEY = torch._C._TorchDispatchModeKey.FAKE
"""The dispatch-mode slot torchdefer's modes occupy, as PyTorch's FakeTensorMode does."""
get_dispatch_mode = torch._C._get_dispatch_mode
torch_function_mode_enabled = torch._C._is_torch_function_mode_enabled
"""Whether a torch-function mode is active (``with torch.device(...)`` is one)."""
set_dispatch_mode = torch._C._set_dispatch_mode
unset_dispatch_mode = torch._C._unset_dispatch_mode
only_lift_cpu_tensors = torch._C._only_lift_cpu_tensors
set_only_lift_cpu_tensors = torch._C._set_only_lift_cpu_tensors
meta_in_tls_dispatch_include = torch._C._meta_in_tls_dispatch_include
set_meta_in_tls_dispatch_include = torch._C._set_meta_in_tls_dispatch_include
storage_id = torch._C._storage_id  # type: ignore[attr-defined]  # not in torch's stubs
"""The address of a tensor's storage impl (``untyped_storage()._cdata`` without building it)."""
AMBIENT_GETTERS: tuple[Any, ...] = (
    torch.get_default_dtype,
    getattr(torch._C, "_get_deterministic_algorithms", torch.are_deterministic_algorithms_enabled),
    getattr(torch._C, "_get_deterministic_algorithms_warn_only",
            torch.is_deterministic_algorithms_warn_only_enabled),
    getattr(torch._C, "_get_deterministic_fill_uninitialized_memory",
            lambda: torch.utils.deterministic.fill_uninitialized_memory),  # type: ignore[attr-defined]
    getattr(torch._C, "_get_float32_matmul_precision", torch.get_float32_matmul_precision),
    torch.is_inference_mode_enabled,
)
"""The readers of ``recorder._ambient.Ambient``'s settings, in its field order: the C
functions the public getters wrap (read for every recorded op; the public
Python wrappers, and ``torch.utils.deterministic``'s module property, cost as
much again), the public ones where a torch lacks them."""
OpOverload = torch._ops.OpOverload


def descriptor_get(cls: type, name: str) -> Callable[[Any], Any]:
    """``cls.name.__get__``: a C property's getter as a function (one call, no lookup).

    torch's stubs type such properties (``Tensor.data``, ``Tensor.mT``) as
    their values, not as the descriptors they are at runtime.
    """
    getter: Callable[[Any], Any] = getattr(cls, name).__get__
    return getter


def descriptor_set(cls: type, name: str) -> Callable[[Any, Any], None]:
    """``cls.name.__set__``: a C property's setter as a function (see :func:`descriptor_get`)."""
    setter: Callable[[Any, Any], None] = getattr(cls, name).__set__
    return setter
# Batch and instance norms' base, whose _load_from_state_dict supplies an absent
# num_batches_tracked for old checkpoints (checkpoint/_module_rules.py).
NormBase = torch.nn.modules.batchnorm._NormBase
"""The class of ``torch.ops.<namespace>.<op>.<overload>`` objects (what dispatch hands us)."""
parse_to = torch._C._nn._parse_to
"""``Tensor.to``'s argument parser: ``(device, dtype, non_blocking, memory_format)``."""
swap_tensor_impl = torch._C._swap_tensor_impl
neg_view = torch._neg_view
_len_pre_dispatch = torch._ops._len_torch_dispatch_stack_pre_dispatch


def dispatch_modes_active() -> bool:
    """Whether any dispatch mode is on: the Python stack, the infra slots (FAKE,
    PROXY, FUNCTIONAL: counted by ``_len_torch_dispatch_stack``) or PreDispatch.
    When none is, ``disable_current_modes`` would take nothing out (~15 us)."""
    return torch._C._len_torch_dispatch_stack() > 0 or _len_pre_dispatch() > 0


def _conv_memory_format() -> Any:
    select = getattr(torch._C, "_select_conv_backend", None)
    determine = getattr(torch._C, "_conv_determine_backend_memory_format", None)
    if select is None or determine is None:
        return None

    def memory_format(input: Any, weight: Any, bias: Any, stride: Any, padding: Any,
                      dilation: Any, transposed: bool, output_padding: Any,
                      groups: int) -> torch.memory_format:
        backend = select(input, weight, bias, stride, padding, dilation, transposed,
                         output_padding, groups, None)
        return determine(input, weight, backend)

    return memory_format


CONV_MEMORY_FORMAT = _conv_memory_format()
"""``(input, weight, bias, stride, padding, dilation, transposed, output_padding,
groups) -> memory_format``: the layout eager's convolution gives its output on
the tensors' devices (the backend ATen picks, and its format; what PyTorch's
FakeTensor asks too), or None on a torch without these bindings. Reads only
metadata, so fake tensors reporting their device answer for it."""


_eval_frame_callback = getattr(torch._C._dynamo.eval_frame, "get_eval_frame_callback", None)


def skip_dynamo_disable_when_not_compiling(mode_class: type) -> None:
    """Call ``mode_class.__torch_dispatch__`` directly while no compiled function runs.

    ``TorchDispatchMode`` wraps each subclass's ``__torch_dispatch__`` in
    ``torch._disable_dynamo`` (``torch/_compile.py``), whose ``inner`` calls the
    ``torch._dynamo.disable`` version it caches as ``fn.__dynamo_disable``.
    That version saves, clears and restores dynamo's frame callback on every
    call (~3 µs, on every recorded op); with no callback installed (no compiled
    function running) it does nothing else. The cached function is replaced by
    one that asks first. Dynamo still sees ``inner``, as before. Needs
    ``torch._dynamo`` imported; does nothing on a torch laid out otherwise.
    """
    wrapper = mode_class.__dict__.get("__torch_dispatch__")
    raw = getattr(wrapper, "__wrapped__", None)
    code = getattr(wrapper, "__code__", None)
    if raw is None or code is None or "__dynamo_disable" not in code.co_names:
        return
    if _eval_frame_callback is None or getattr(raw, "_torchdefer_fast", False):
        return
    import torch._dynamo
    import torch._dynamo.eval_frame

    skip_code = getattr(torch._dynamo.eval_frame, "skip_code", None)
    if skip_code is None:
        return
    disabled = torch._dynamo.disable(raw, recursive=True, wrapping=False)
    callback = _eval_frame_callback

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if callback() is None:
            return raw(*args, **kwargs)
        return disabled(*args, **kwargs)

    # Its own frames run while a compiled function does: dynamo must not compile
    # them (disable's function lives in dynamo's files, which it skips).
    skip_code(dispatch.__code__)
    # What dynamo's tracer reads on disable's function (it does not inline it).
    for name in ("_torchdynamo_disable", "_torchdynamo_disable_recursive"):
        setattr(dispatch, name, getattr(disabled, name, True))
    # Function attributes dynamo reads (set on purpose; a function type has no such fields).
    dispatch._torchdynamo_disable_msg = getattr(  # type: ignore[attr-defined]
        disabled, "_torchdynamo_disable_msg", None
    )
    dispatch._torchdynamo_orig_callable = raw  # type: ignore[attr-defined]
    raw.__dynamo_disable = dispatch
    raw._torchdefer_fast = True


def dispatch_wrapper_frames(mode_class: type) -> int:
    """How many Python frames at least sit between ``mode_class``'s own
    ``__torch_dispatch__`` and the dispatcher that calls it (the wrappers of
    its class attribute).

    After :func:`skip_dynamo_disable_when_not_compiling`, the attribute is
    torch's ``inner``, which calls ``dispatch`` (or, under a compiled
    function, dynamo's disabled function), which calls the function itself:
    two frames or more. A Python wrapper of another make: one, itself; none
    (or one written in C): none.
    """
    wrapper = mode_class.__dict__.get("__torch_dispatch__")
    raw = getattr(wrapper, "__wrapped__", None)
    if raw is None or getattr(wrapper, "__code__", None) is None:
        return 0
    return 2 if getattr(raw, "_torchdefer_fast", False) else 1


BCOMPLEX32 = getattr(torch, "bcomplex32", None)
"""torch 2.15's complex bfloat16. Its Python type promotion (the meta kernels'
``_prims_common``) makes it bfloat16's complex counterpart, where the C++
kernels eager runs on CPU/CUDA give complex64: ``arange(3) * 1j`` under a
bfloat16 default dtype. None before 2.15."""


def import_dynamo() -> None:
    """Import ``torch._dynamo`` now: when first imported it patches ``Tensor._make_subclass``."""
    import torch._dynamo  # noqa: F401


def fsdp1_init_utils() -> Any:
    """FSDP1's ``torch.distributed.fsdp._init_utils`` (its materialization hook lives there)."""
    from torch.distributed.fsdp import _init_utils

    return _init_utils


def default_device_context() -> Any:
    """The ``DeviceContext`` that ``torch.set_default_device`` installed, or None.

    Not ``torch.get_default_device()``: that builds a tensor, which fails under
    ``with torch.device("cuda")`` on a host without CUDA.
    """
    return getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)


def restore_default_device(context: Any) -> None:
    """Put back the default device that :func:`default_device_context` returned.

    torch 2.8 stores the None that ``set_default_device(None)`` leaves and then
    crashes in ``get_default_device()`` (and in all later code that asks it)
    reading ``None.device`` (2.10 reads it safely). With no context at all
    every version answers "cpu", so the stored None is dropped everywhere.
    """
    torch.set_default_device(None if context is None else context.device)
    if context is None and hasattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context"):
        del torch._GLOBAL_DEVICE_CONTEXT.device_context


def hash_tensor(t: torch.Tensor) -> torch.Tensor:
    """``torch.hash_tensor(t)``: the xor of ``t``'s elements widened to 64 bits.

    torch 2.8 has no torch.hash_tensor (2.10 has it); there the same xor is
    folded here: a 0-dim int64 tensor with the bits of torch's uint64 result.
    """
    if hasattr(torch, "hash_tensor"):
        return torch.hash_tensor(t)
    return _xor_fold(t)


def _xor_fold(t: torch.Tensor) -> torch.Tensor:
    wide = torch.float64 if t.is_floating_point() else torch.int64
    flat = t.reshape(-1).to(wide).view(torch.int64)
    if flat.numel() == 0:
        return torch.zeros((), dtype=torch.int64, device=t.device)
    while flat.numel() > 1:  # halve: log2(n) vector xors instead of a Python loop
        if flat.numel() % 2:
            flat = torch.cat([flat, flat.new_zeros(1)])
        half = flat.numel() // 2
        flat = flat[:half] ^ flat[half:]
    return flat[0]


# ---- CUDA kernels' launch arithmetic (rng/cuda_increments.py) -------------------

PHILOX_TABLE_TORCH = ((2, 8), (2, 15))
"""The torch releases whose CUDA random kernels ``rng/cuda_increments.py`` was
written for (``distribution_nullary_kernel`` with ``calc_execution_policy(numel,
unroll_factor)``, the same in 2.8 through 2.15). Keyed by version, not by a
feature probe: the arithmetic lives in CUDA kernels Python cannot inspect, and
checking it needs a GPU (``make test-gpu``). Extend the range when the probe
passes on a newer release."""


def philox_table_applies(version: str | None = None) -> bool:
    """Whether the CUDA increment table holds for ``version`` (default: the installed torch).

    Outside the range every CUDA random op is run to reach the positions after
    it (exact, slower): a table written for other kernels is never trusted.
    """
    return _philox_table_applies(version or torch.__version__)


@functools.cache
def _philox_table_applies(version: str) -> bool:
    release = version.split("+")[0].split(".")
    try:
        major_minor = (int(release[0]), int(release[1]))
    except (IndexError, ValueError):
        return False
    low, high = PHILOX_TABLE_TORCH
    return low <= major_minor <= high


# Kernels that, registered for an op beside its CompositeImplicitAutograd one,
# run instead of the decomposition at the backend key; or, ADInplaceOrView's
# (chunk, narrow), make its outputs views of the input themselves, on the way
# to the mode: decomposing with the key dispatched would make them views twice.
_OWN_KERNELS = ("CPU", "CUDA", "CompositeExplicitAutograd",
                "CompositeExplicitAutogradNonFunctional", "ADInplaceOrView")


@functools.cache
def decomposes_to_views(func: Any) -> bool:
    """Whether ``func`` (an OpOverload) returns views through its CompositeImplicitAutograd
    kernel, which eager runs at the backend key when autograd's keys are skipped
    (inference mode): ``reshape``, ``flatten``, ``unflatten``, ``view_as``, ``movedim``...

    Such an op reaches a dispatch mode whole in inference mode; eager's
    decomposition makes its views below ``ADInplaceOrView``, which makes them
    autograd views of a normal base (``requires_grad`` follows the base's).
    """
    if not isinstance(func, OpOverload):
        return False
    name = func.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    try:
        if not has(name, "CompositeImplicitAutograd") or any(has(name, k) for k in _OWN_KERNELS):
            return False
    except RuntimeError:  # an overload TorchScript knows and the dispatcher does not (mT.a)
        return False
    return any(
        r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns
    )


def decomposed_in_inference(func: Any, args: tuple, kwargs: dict) -> Any:
    """In inference mode, ``func(*args, **kwargs)`` run from a dispatch handler as eager's
    backend key runs it, if it is of :func:`decomposes_to_views`; else None.

    Its CompositeImplicitAutograd kernel runs with ``ADInplaceOrView``
    dispatched for the ops it calls (PyTorch excludes the key while a
    ``__torch_dispatch__`` runs): their views of a normal tensor come out
    autograd views of it, as eager's do.
    """
    if not torch.is_inference_mode_enabled() or not decomposes_to_views(func):
        return None
    key = torch._C.DispatchKey.ADInplaceOrView
    excluded = torch._C._dispatch_tls_is_dispatch_key_excluded(key)
    torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
    try:
        return func.decompose(*args, **kwargs)
    finally:
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, excluded)
