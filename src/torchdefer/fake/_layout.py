"""Output strides eager gives where the meta kernels give others.

Batch norm's CPU and CUDA kernels write a fresh tensor in the input's
*suggested* memory format (contiguous, or channels-last for 4-d/5-d inputs
strided that way); the meta kernel keeps the input's strides, so a transposed
input gave a fake output that ``.t().contiguous()`` then aliased while eager
copied it.

``empty_like``, the other ``*_like`` factories, ``clone`` and ``_to_copy`` with
``memory_format=torch.preserve_format`` copy the input's strides exactly when
it is non-overlapping and dense (``at::empty_like``, ``at::clone``,
``at::_to_copy``). Their meta kernels compute canonical strides instead, which
differ on size-1 dimensions: ``torch.zeros(1, 5).t()`` has strides ``(1, 5)``,
its meta ``empty_like`` ``(1, 1)``. A fake tensor that reported those would
show user code other strides than eager, and replay would rebuild views of
the real storage with the wrong ones.

Random ops with tensor parameters (``normal`` with a tensor mean or std,
``poisson``, ``_standard_gamma``, ``rrelu_with_noise``) allocate their output
with ``at::empty(size)``, or ``empty_like(..., MemoryFormat::Contiguous)``:
row-major whatever the inputs' layout, on the CPU and on CUDA. Their meta
kernels keep a transposed std's strides, so the fake output reported other
strides than eager's and the draw model, which reads the output's contiguity,
counted the draws of the wrong code path (``draw model is wrong`` at replay).

``native_dropout``'s mask is ``empty_like(input)`` (the input's strides, as
above), where its meta kernel lays it out like the output. Its output is a new
tensor unless the input is empty (then the input itself); the meta
decomposition returned the input itself when not training or at ``p=0``, so a
write to the output reached the input, unlike eager's.

LAPACK writes ``linalg_eig``'s eigenvectors column-major per matrix; torch
2.8's meta kernel gives row-major ones (fixed in later releases, where the
restriding below changes nothing).

A few binary elementwise ops have Python meta kernels that lay out their
output contiguous where TensorIterator keeps the inputs' order
(``copysign``, ``xlogy``, ``div`` with a rounding mode of a transposed
tensor): a ``reshape`` of the fake output viewed what eager copied. Those
take TensorIterator's rule (``fake/_iterator.py``), and so do the unary and
binary pointwise ops whose meta kernels lay out otherwise in size-1 and size-0
dimensions (``fake/_pointwise.py``: the sweep that proved its tables).

A convolution's output is laid out by the backend ATen picks for the real
device (mkldnn gives a channels_last input a channels_last output); its meta
kernel, which knows no device, gives a contiguous one. Recorded so, a later
``reshape`` viewed what eager copied, and a random init drew in the wrong
order (``draw model is wrong`` at replay). The backend and its format are
asked of ATen with the fake tensors, which report the real device.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdefer import _compat
from torchdefer.fake._iterator import iterator_strides, non_overlapping_and_dense
from torchdefer.fake._pointwise import (
    BINARY_ITERATED,
    BY_DTYPE,
    CONTIGUOUS,
    CONTIGUOUS_ON_CPU,
    ITERATED,
    ITERATED_OPERANDS,
    LIKE_INPUT,
    TERNARY_ITERATED,
    WITH_SCALAR,
    dtype_kind,
)
from torchdefer.fake._state import STATE

__all__ = ["eager_layout", "meta_twin", "non_overlapping_and_dense", "suggest_memory_format"]

_aten = torch.ops.aten
_PRESERVING = frozenset(
    {
        _aten.empty_like, _aten.zeros_like, _aten.ones_like, _aten.full_like,
        _aten.rand_like, _aten.randn_like, _aten.randint_like, _aten.clone, _aten._to_copy,
    }
)  # fmt: skip


# op -> indices of its outputs that eager writes column-major per matrix
_COLUMN_MAJOR = {_aten.linalg_eig: (1,)}

# ops whose (first) output eager allocates row-major whatever the inputs' layout
_ROW_MAJOR = frozenset(
    {
        _aten.normal, _aten.poisson, _aten._standard_gamma, _aten.rrelu_with_noise,
    }
)  # fmt: skip

_SUGGESTED_FORMAT = frozenset(
    {
        _aten.native_batch_norm, _aten._native_batch_norm_legit,
        _aten._native_batch_norm_legit_no_training, _aten._native_batch_norm_legit_functional,
    }
)  # fmt: skip


_CONVOLUTIONS = frozenset({_aten.convolution, _aten._convolution})

# Overloads whose meta kernels lay out a fresh output otherwise than
# TensorIterator beyond size-1 dimensions (found by sweeping every pointwise
# aten op of two tensors over transposed, broadcast and 0-d partners).
# The ops of fake/_pointwise.py differ so in size-1 dimensions.
# op -> how many leading arguments are TensorIterator's operands
_ITERATED = {
    **dict.fromkeys((_aten.copysign.Tensor, _aten.xlogy.Tensor, _aten.special_xlog1py.default,
                     _aten.div.Tensor_mode, _aten.floor_divide.default), 2),
    **dict.fromkeys(BINARY_ITERATED, 2), **dict.fromkeys(TERNARY_ITERATED, 3),
}

# Every packet eager_layout restrides (a rule added above must be added here).
_RESTRIDED = frozenset(
    {*_SUGGESTED_FORMAT, *_COLUMN_MAJOR, *_PRESERVING, *_ROW_MAJOR, *_CONVOLUTIONS,
     _aten.native_dropout}
)

# unary pointwise overload -> how eager lays out its output (fake/_pointwise.py)
_UNARY = {
    **dict.fromkeys(ITERATED, "iterated"), **dict.fromkeys(WITH_SCALAR, "with_scalar"),
    **dict.fromkeys(LIKE_INPUT, "like_input"), **dict.fromkeys(CONTIGUOUS, "contiguous"),
    **dict.fromkeys(CONTIGUOUS_ON_CPU, "contiguous_on_cpu"), **dict.fromkeys(BY_DTYPE, "by_dtype"),
}

# id(op) -> (op, whether its packet is in _RESTRIDED): asked for every op, and
# OpOverload/OpOverloadPacket hash in Python.
_restrided: dict[int, tuple[Any, bool]] = {}


def eager_layout(
    func: Any, args: tuple, kwargs: dict, out: Any, device: torch.device | None = None
) -> Any:
    """``out`` (meta tensors), restrided as eager would lay it out on ``device`` (CPU if None)."""
    known = _restrided.get(id(func))
    if known is None:
        packet = getattr(func, "overloadpacket", None)
        special = (packet in _RESTRIDED or func in _ITERATED or func in _UNARY
                   or func in ITERATED_OPERANDS or func is _aten.ldexp.Tensor)
        known = _restrided[id(func)] = (func, special)  # keeps func, so its id stays its own
    if not known[1]:
        return out
    if func is _aten.float_power.Tensor_Tensor:
        return _iterated(_converted(args[:2], out), 2, out)
    if func in _ITERATED:
        return _iterated(args, _ITERATED[func], out)
    if func in _UNARY:
        return _unary(_unary_rule(func, args, kwargs, device), args, kwargs, out)
    if func in ITERATED_OPERANDS:
        return _iterated_operands(func, args, kwargs, out)
    if func is _aten.ldexp.Tensor:
        return _ldexp(args, kwargs, out)
    packet = getattr(func, "overloadpacket", None)
    if packet in _SUGGESTED_FORMAT:
        return _in_suggested_format(args[0], out)
    if packet in _ROW_MAJOR:
        return _row_major(func, out)
    if packet in _CONVOLUTIONS:
        return _convolution(args, kwargs, out, device)
    if packet in _COLUMN_MAJOR and isinstance(out, tuple):
        return tuple(_column_major(o) if i in _COLUMN_MAJOR[packet] else o
                     for i, o in enumerate(out))
    if packet is _aten.native_dropout and isinstance(out, tuple) and len(out) == 2:
        return _native_dropout(func, args, kwargs, out, device)
    if packet not in _PRESERVING:
        return out
    if kwargs.get("memory_format") not in (None, torch.preserve_format):
        return out
    return _preserved(args[0] if args else None, out)


def _native_dropout(func: Any, args: tuple, kwargs: dict, out: tuple, device: Any) -> tuple:
    """``native_dropout``'s results, never the input itself where eager's is new.

    CPU: the input itself and an empty mask of its dtype when it is empty, else
    ``input.mul(mask)`` training and ``input.clone()`` not. CUDA: ``clone()``
    not training, else ``empty_like(input)`` and a bool mask like it.
    """
    source = args[0] if args else None
    if not isinstance(source, torch.Tensor) or func._schema.returns[0].alias_info is not None:
        return out
    output, mask = out[0], _preserved(source, out[1])
    cpu = device is None or device.type == "cpu"
    if cpu and source.numel() == 0:
        return source, _preserved(source, torch.empty_like(source))
    train = args[2] if len(args) > 2 else kwargs.get("train")
    if train is not None and not train:
        return _preserved(source, torch.empty_like(source)), mask
    if not cpu:
        return _preserved(source, output), mask
    if output is source:  # the meta decomposition's shortcut at p=0
        output = torch.mul(source, torch.empty_like(mask, dtype=source.dtype))
    return output, mask


def _iterated(args: tuple, count: int, out: Any) -> Any:
    """``out`` laid out as TensorIterator lays out a fresh output of the first ``count`` args."""
    if not isinstance(out, torch.Tensor) or len(args) < count:  # one passed by keyword
        return out
    layouts = []
    for a in args[:count]:  # a Python number is the 0-d tensor ATen wraps it in
        if isinstance(a, torch.Tensor):
            layouts.append((tuple(a.shape), a.stride()))
        elif isinstance(a, (bool, int, float, complex)):
            layouts.append(((), ()))
        else:
            return out
    stride = iterator_strides(layouts, tuple(out.shape))
    if stride == out.stride():
        return out
    return torch.empty_strided(out.shape, stride, dtype=out.dtype, device="meta")


def _converted(args: tuple, out: Any) -> tuple:
    """``args`` as ``float_power`` iterates them: each tensor of another dtype than
    ``out`` first converted with ``.to(dtype)``, which lays it out as ``empty_like``
    does (an expanded input becomes dense, in its dimensions' order)."""
    if not isinstance(out, torch.Tensor):
        return args
    converted = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype != out.dtype:
            a = torch.empty_like(meta_twin(a), dtype=out.dtype)
        converted.append(a)
    return tuple(converted)


def _unary_rule(func: Any, args: tuple, kwargs: dict, device: Any) -> str:
    rule = _UNARY[func]
    if rule == "contiguous_on_cpu":
        return "contiguous" if device is None or device.type == "cpu" else "meta"
    if rule == "by_dtype":
        source = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        kind = "floating" if source is None else dtype_kind(source.dtype)
        return BY_DTYPE[func].get(kind, "iterated")
    return rule


def _iterated_operands(func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
    """TensorIterator over the operands ``ITERATED_OPERANDS`` names (fake/_pointwise.py)."""
    indices, then_scalar = ITERATED_OPERANDS[func]
    names = [a.name for a in func._schema.arguments]
    layouts = []
    for i in indices:
        a = args[i] if i < len(args) else kwargs.get(names[i]) if i < len(names) else None
        if isinstance(a, torch.Tensor):
            layouts.append((tuple(a.shape), a.stride()))
        elif a is not None:
            return out
    if not isinstance(out, torch.Tensor) or not layouts:
        return out
    size = tuple(out.shape)
    stride = iterator_strides(layouts, size)
    if then_scalar:
        stride = iterator_strides([(size, stride), ((), ())], size)
    return _restrided_to(out, size, stride)


def _ldexp(args: tuple, kwargs: dict, out: Any) -> Any:
    """``ldexp(self, other)``: with an integer ``other`` and a floating ``self``, ATen
    fills ``empty_like(self)`` (TensorIterator restrides it where it must grow);
    else ``self * pow(2, other)``."""
    self, other = (*args, *kwargs.values())[:2] if len(args) + len(kwargs) >= 2 else (None, None)
    if not (isinstance(self, torch.Tensor) and isinstance(other, torch.Tensor)):
        return out
    if not isinstance(out, torch.Tensor):
        return out
    size = tuple(out.shape)
    if dtype_kind(other.dtype) == "integral" and self.dtype.is_floating_point:
        if tuple(self.shape) == size:
            return _unary("like_input", (self,), {}, out)
        layouts = [(tuple(self.shape), self.stride()), (tuple(other.shape), other.stride())]
    else:  # pow(2.0, other): row-major (pow.Scalar); a 0-d two's pow for wider floats
        shape = tuple(other.shape)
        if dtype_kind(self.dtype) == "integral" or self.dtype == torch.float32:
            powered = torch.empty(shape, device="meta").stride()
        else:
            powered = iterator_strides([((), ()), (shape, other.stride())], shape)
        layouts = [(tuple(self.shape), self.stride()), (shape, powered)]
    return _restrided_to(out, size, iterator_strides(layouts, size))


def _unary(rule: str, args: tuple, kwargs: dict, out: Any) -> Any:
    """A unary pointwise op's fresh output(s) laid out as TensorIterator (with a
    0-d operand for a scalar), or ``empty_like`` of its one tensor argument, lays
    them out (``rule``, from ``fake/_pointwise.py``)."""
    source = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
    if source is None or rule == "meta":
        return out
    if rule == "contiguous":  # of the output's own shape (masked_fill broadcasts)
        if isinstance(out, tuple):
            return tuple(_row_major_of(o) for o in out)
        return _row_major_of(out)
    size, stride = tuple(source.shape), source.stride()
    if rule == "like_input_if_filled":
        rule = "iterated" if 0 in size else "like_input"
    if rule == "iterated":
        wanted = iterator_strides([(size, stride)], size)
    elif rule == "with_scalar":  # a 0-d operand is broadcast, so its order does not matter
        wanted = iterator_strides([(size, stride), ((), ())], size)
    elif 0 in size or non_overlapping_and_dense(size, stride):
        wanted = stride
    else:  # empty_like's own rule (infer_dense_strides: an expanded input's order kept)
        twin = torch.empty_strided(size, stride, device="meta")
        wanted = torch.empty_like(twin).stride()
    if isinstance(out, tuple):
        return tuple(_restrided_to(o, size, wanted) for o in out)
    return _restrided_to(out, size, wanted)


def _row_major_of(out: Any) -> Any:
    if not isinstance(out, torch.Tensor):
        return out
    row_major = torch.empty(out.shape, dtype=out.dtype, device="meta")
    return out if out.stride() == row_major.stride() else row_major


def _restrided_to(out: Any, size: tuple[int, ...], stride: tuple[int, ...]) -> Any:
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != size or out.stride() == stride:
        return out
    return torch.empty_strided(size, stride, dtype=out.dtype, device="meta")


_CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "transposed",
              "output_padding", "groups")


def _convolution(args: tuple, kwargs: dict, out: Any, device: torch.device | None) -> Any:
    """``out`` laid out as the convolution backend of the input's device lays it out.

    Only where this process's ATen picks the backend eager would: the CPU, or
    CUDA when it is there (on a host without it, ATen would answer for a GPU
    without cuDNN; the layout replay gives is then taken as it comes).
    """
    if _compat.CONV_MEMORY_FORMAT is None or not isinstance(out, torch.Tensor):
        return out
    if device is not None and device.type != "cpu" and not (
            device.type == "cuda" and torch.cuda.is_available()):
        return out
    bound = dict(zip(_CONV_ARGS, args))
    bound.update((k, v) for k, v in kwargs.items() if k in _CONV_ARGS)
    # ATen views a 1-d convolution's tensors as 2-d (contiguous) to choose, an op
    # fake tensors cannot run without dispatch; its output stays contiguous.
    source, weight = bound.get("input"), bound.get("weight")
    if not isinstance(source, torch.Tensor) or not isinstance(weight, torch.Tensor) or (
            source.dim() not in (4, 5) or weight.dim() != source.dim()):
        return out
    in_kernel, STATE.in_kernel = STATE.in_kernel, False  # the tensors report their device
    try:
        fmt = _compat.CONV_MEMORY_FORMAT(*(bound[name] for name in _CONV_ARGS))
    except (KeyError, RuntimeError, TypeError):  # arguments ATen refuses: meta's answer
        return out
    finally:
        STATE.in_kernel = in_kernel
    if (fmt == torch.channels_last and out.dim() != 4) or (
            fmt == torch.channels_last_3d and out.dim() != 5):
        return out
    wanted = torch.empty(out.shape, dtype=out.dtype, device="meta", memory_format=fmt)
    return out if wanted.stride() == out.stride() else wanted


def _preserved(source: Any, out: Any) -> Any:
    """``out`` with ``source``'s strides where ``empty_like(source)`` keeps them."""
    if not isinstance(out, torch.Tensor) or not isinstance(source, torch.Tensor):
        return out
    try:
        size, stride = tuple(source.shape), source.stride()
    except (RuntimeError, ValueError):  # an UninitializedParameter hides its shape
        return out
    if tuple(out.shape) != size or out.stride() == stride:
        return out
    # an empty tensor is contiguous, so non-overlapping and dense, to torch
    if 0 not in size and not non_overlapping_and_dense(size, stride):
        return out
    return torch.empty_strided(size, stride, dtype=out.dtype, device="meta")


def _row_major(func: Any, out: Any) -> Any:
    """A fresh output restrided row-major; an ``out=`` or in-place result is the user's own."""
    if not isinstance(out, torch.Tensor) or _returns_an_argument(func):
        return out
    wanted = torch.empty(out.shape, dtype=out.dtype, device="meta")
    return out if wanted.stride() == out.stride() else wanted


def _returns_an_argument(func: Any) -> bool:
    return any(r.alias_info is not None for r in func._schema.returns)


def _column_major(t: Any) -> Any:
    if not isinstance(t, torch.Tensor) or t.dim() < 2:
        return t
    return torch.empty(*t.shape[:-2], t.shape[-1], t.shape[-2], dtype=t.dtype, device="meta").mT


def meta_twin(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with ``t``'s size, strides and dtype (no data, nothing else kept)."""
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")


def _in_suggested_format(source: Any, out: Any) -> Any:
    """Batch norm's outputs: the first one laid out in ``source``'s suggested format."""
    if not isinstance(out, tuple) or not out or not isinstance(source, torch.Tensor):
        return out
    first = out[0]
    size = tuple(first.shape)
    fmt = suggest_memory_format(tuple(source.shape), source.stride())
    wanted = torch.empty(size, dtype=first.dtype, device="meta", memory_format=fmt)
    if wanted.stride() == first.stride():
        return out
    return (wanted, *out[1:])


def suggest_memory_format(size: tuple[int, ...], stride: tuple[int, ...]) -> torch.memory_format:
    """``Tensor.suggest_memory_format()`` for a strided tensor of ``size`` and ``stride``.

    Channels-last when the tensor is not contiguous and is channels-last
    contiguous or strided like channels-last (``c10/core/MemoryFormat.h``;
    checked against the CPU kernels on thousands of layouts in the tests).
    """
    if len(size) not in (4, 5):
        return torch.contiguous_format
    fmt = torch.channels_last if len(size) == 4 else torch.channels_last_3d
    probe = torch.empty_strided(size, stride, device="meta")
    if probe.is_contiguous():
        return torch.contiguous_format
    order = (1, 3, 2, 0) if len(size) == 4 else (1, 4, 3, 2, 0)
    if probe.is_contiguous(memory_format=fmt) or _channels_last_strides(size, stride, order):
        return fmt
    return torch.contiguous_format


def _channels_last_strides(size, stride, order) -> bool:
    """``is_channels_last_strides_2d_s4`` / ``_3d_s5``, ambiguities resolved as NCHW."""
    if stride[1] == 0:
        return False
    low = 0
    for d in order:
        if size[d] == 0 or stride[d] < low:
            return False
        if d == 0 and low == stride[1]:
            return False
        low = stride[d] * (size[d] if size[d] > 1 else 1)
    return True
