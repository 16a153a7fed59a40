"""How far each random op moves a CUDA generator's Philox offset: the table.

Written from PyTorch's CUDA kernels (paths under ``aten/src/ATen/``; read at
the ``pytorch/pytorch`` snapshot of ``native/cuda/DistributionTemplates.h``
0140b62d, ``native/DistributionTemplates.h`` efc9242a, ``TensorIterator.cpp``
c30d1cc7), checked on the CPU against PyTorch's Python copies of the launch
formula (``tests/rng/test_cuda_increments.py``). ``make test-gpu`` checks it
on a device; it has not run on one yet (the session that wrote it had no GPU).

=====================  ==========================  ==========================  ==========
op                     dtype                       size regime                 increment
=====================  ==========================  ==========================  ==========
normal_ normal randn   float16 bfloat16 float32    any (see below)             nullary(4)
randn_like log_normal_ float64                     any                         nullary(2)
                       complex64 / complex128      2N reals (view_as_real)     nullary(4/2)
uniform_ uniform rand  as normal_                  as normal_                  as normal_
rand_like
exponential_ cauchy_   float64                     any                         nullary(2)
geometric_ bernoulli_  every other dtype           any                         nullary(4)
(float p) bernoulli.p
random_()              int64 float64               any                         nullary(2)
                       every other dtype           any                         nullary(4)
random_(from, to)      any                         range = to - from           2 if range
randint randint_like                               (from/to rounded to the     >= 2**28,
                                                   dtype for floating types)   else 4
random_(from, None)    any                         range = max(dtype)-from+1   as above
random_(INT64_MIN, None) int64 float64 float32 bf16 2**64                      nullary(2)
randint_like(t, Tensor high)                       high's value: not known     run
bernoulli_(Tensor p) bernoulli(t) randperm multinomial native_dropout rrelu_with_noise
poisson _standard_gamma binomial _sample_dirichlet                             run
=====================  ==========================  ==========================  ==========

``nullary(u)`` is ``distribution_nullary_kernel`` (``native/cuda/
DistributionTemplates.h``) with unroll ``u = sizeof(dist_func_return_t) /
sizeof(accscalar_t)`` (``float4``/``uint4``: 4; ``double2``/``ulonglong2``:
2). It reserves ``calc_execution_policy(numel, u)``'s counter from the
generator (``CUDAGeneratorImpl::philox_cuda_state`` rounds it up to a multiple
of 4) *before* checking ``iter.can_use_32bit_indexing()``; when that fails
(more than 2**31-1 elements, or a byte extent ``1 + sum((size-1) * stride *
itemsize)`` over 2**31-1, also for few elements with large strides) it calls
itself on each sub-iterator of ``iter.with_32bit_indexing()``, and each
sub-launch reserves its own counter. The geometry those checks see is
TensorIterator's (``fast_set_up`` collapses a dense tensor to one dimension;
otherwise ``reorder_dimensions`` and ``coalesce_dimensions``), mirrored here.
The grid depends on the properties of the device the op runs on
(``getCurrentDeviceProperties()`` under the op's device guard).

The source lines each row rests on:

* ``calc_execution_policy``: ``counter_offset = ((numel - 1) / (block_size *
  grid.x * unroll_factor) + 1) * max_generator_offsets_per_curand_call``, with
  ``grid.x = min(multiProcessorCount * (maxThreadsPerMultiProcessor /
  block_size), ceil(numel / 256))``;
* ``distribution_nullary_kernel``: ``rng_engine_inputs =
  gen->philox_cuda_state(counter_offset);`` then ``if
  (!iter.can_use_32bit_indexing()) { for (auto& sub_iter :
  iter.with_32bit_indexing()) distribution_nullary_kernel<...>(sub_iter, ...)``;
* ``uniform_and_transform`` / ``normal_and_transform``: ``if
  (std::is_same_v<scalar_t, double>)`` ``double2`` else ``float4``;
* ``random_kernel``: ``double`` or ``int64_t`` draw ``ulonglong2``, others
  ``uint4``; ``random_from_to_kernel``: ``if (range >= 1ULL << 28)``
  ``ulonglong2`` else ``uint4``; ``random_full_64_bits_range_kernel``:
  ``ulonglong2``;
* ``random_from_to_impl`` (``native/DistributionTemplates.h``): without
  ``to``, ``to_inc`` is ``1 << digits`` (floating), the type's max
  (integral) or ``true`` (bool), ``range = to_inc - from + 1``, and
  ``from == lowest`` takes the full 64-bit kernel; ``update_from`` /
  ``update_to`` round the bounds of floating types;
* ``normal_impl_`` / ``uniform_impl_``: ``if (self.is_complex())``
  ``at::view_as_real(self)``;
* ``bernoulli_kernel(self, p_, gen)``: ``gen->philox_cuda_state(10)`` whatever
  the size (a ``run`` row until a GPU confirms it);
* ``TensorIterator.cpp``: ``can_use_32bit_indexing``, ``get_dim_to_split``,
  ``split`` (the first half is ``shape[dim] / 2``), ``narrow`` (re-coalesces
  at size 1), ``reorder_dimensions``, ``coalesce_dimensions``, ``fast_set_up``.

``run`` rows are not counted: their positions are reached by running them
(``rng._states``). ``make test-gpu`` measures them too, so that a GPU run
can turn one into a counted row.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from torchdefer import _compat
from torchdefer.rng.draws import Drawn, TensorInfo, schema_value
from torchdefer.rng.philox import DeviceShape, counter_increment

__all__ = ["COUNTED", "RUN", "increment", "launch_numels", "unroll"]

_aten = torch.ops.aten
_INT32_MAX = (1 << 31) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_WIDE_RANGE = 1 << 28  # random_from_to_kernel: 64-bit draws from this range on
_HUGE = 1 << 40  # from here a launch's block count wraps in dim3: not modeled

_NORMAL = frozenset({_aten.normal_, _aten.normal, _aten.randn, _aten.randn_like})
_UNIFORM = frozenset({_aten.uniform_, _aten.uniform, _aten.rand, _aten.rand_like})
# uniform_and_transform / normal_and_transform with an accscalar_t that is
# double only for float64 outputs.
_REAL_ONLY = frozenset(
    {
        _aten.log_normal_, _aten.log_normal, _aten.exponential_, _aten.exponential,
        _aten.cauchy_, _aten.cauchy, _aten.geometric_, _aten.geometric,
    }
)  # fmt: skip
_BERNOULLI_SCALAR = frozenset({_aten.bernoulli_.float, _aten.bernoulli.p})
_RANDOM = frozenset({_aten.random_, _aten.random, _aten.randint, _aten.randint_like})

COUNTED = _NORMAL | _UNIFORM | _REAL_ONLY | _RANDOM | {_aten.bernoulli_, _aten.bernoulli}
"""Op packets with counted rows (``bernoulli`` only with a float ``p``)."""

RUN = frozenset(
    {
        _aten.bernoulli_, _aten.bernoulli, _aten.randperm, _aten.multinomial,
        _aten.native_dropout, _aten.rrelu_with_noise, _aten.rrelu_with_noise_,
        _aten.poisson, _aten._standard_gamma, _aten.binomial, _aten._sample_dirichlet,
    }
)  # fmt: skip
"""Op packets whose CUDA draws are run, not counted (``bernoulli`` with a tensor ``p``)."""


def increment(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], drawn: Drawn, shape: DeviceShape
) -> int | None:
    """How far ``func(*args, **kwargs)`` writing ``drawn`` moves the Philox offset; None: run it.

    ``drawn`` is the tensor the kernel fills (the output, or ``self`` in
    place); tensors may be real, fake or :class:`~torchdefer.rng.draws.TensorInfo`.
    ``shape`` is the device the op runs on.

    Example::

        >>> from torchdefer.rng.philox import DeviceShape
        >>> h100 = DeviceShape(132, 2048)
        >>> t = torch.empty(10**6, device="meta")
        >>> increment(torch.ops.aten.normal_.default, (t,), {}, t, h100)
        4
    """
    if os.environ.get("TORCHDEFER_RNG_JUMPS") == "0" or not _compat.philox_table_applies():
        return None
    u = unroll(func, args, kwargs, drawn)
    if u is None:
        return None
    size, stride, itemsize = _real_layout(drawn)
    if math.prod(size) >= _HUGE:
        return None
    return sum(counter_increment(n, u, shape) for n in launch_numels(size, stride, itemsize))


def unroll(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], drawn: Drawn) -> int | None:
    """Values per Philox call of ``func``'s nullary kernel (4 or 2); None if not one."""
    packet = func.overloadpacket
    dtype = drawn.dtype
    if dtype.is_complex:  # normal_/uniform_ draw through view_as_real
        if packet in _NORMAL or packet in _UNIFORM:
            return 2 if dtype == torch.complex128 else 4
        return None
    if packet in _NORMAL or packet in _UNIFORM or packet in _REAL_ONLY:
        return 2 if dtype == torch.float64 else 4
    if func in _BERNOULLI_SCALAR:
        return 2 if dtype == torch.float64 else 4
    if packet in _RANDOM:
        return _random_unroll(func, args, kwargs, dtype)
    return None


@functools.cache
def _argument_names(func: Any) -> frozenset[str]:
    return frozenset(a.name for a in func._schema.arguments)


def _random_unroll(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype
) -> int | None:
    """``random_`` and its factory forms (``native/DistributionTemplates.h``)."""
    names = _argument_names(func)
    value = functools.partial(schema_value, func, args, kwargs)
    if "high" in names:  # randint(high | low, high), randint_like: random_(low, high)
        high = value("high")
        if isinstance(high, (torch.Tensor, TensorInfo)):
            return None  # randint_like(t, Tensor high): the range is high's value
        low = value("low") if "low" in names else 0
        return _from_to_unroll(int(low), int(high), dtype)
    if "to" not in names:  # random_(): random_kernel draws 64 bits for double, int64
        return 2 if dtype in (torch.float64, torch.int64) else 4
    start = int(value("from")) if "from" in names else 0
    to = value("to")
    if to is not None:
        return _from_to_unroll(start, int(to), dtype)
    if start == _INT64_MIN:  # random_full_64_bits_range_kernel
        return 2
    if dtype.is_floating_point:  # random_from_to_impl: [from, 2**digits]
        to_inc = min(1 << _digits(dtype), _INT64_MAX)
        start = _update_from(start, dtype)
    elif dtype == torch.bool:
        to_inc = 1
    else:
        to_inc = torch.iinfo(dtype).max
    return 2 if to_inc - start + 1 >= _WIDE_RANGE else 4


def _from_to_unroll(start: int, to: int, dtype: torch.dtype) -> int:
    if dtype.is_floating_point:
        start, to = _update_from(start, dtype), _update_to(to, dtype)
    return 2 if (to - start) % (1 << 64) >= _WIDE_RANGE else 4


def _digits(dtype: torch.dtype) -> int:
    """``std::numeric_limits<scalar_t>::digits``: significand bits with the implicit one."""
    return {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}[dtype]


def _to_dtype(x: int, dtype: torch.dtype) -> int:
    """``static_cast<int64_t>(static_cast<scalar_t>(x))``: round to nearest even."""
    digits = _digits(dtype)
    magnitude = abs(x)
    drop = max(magnitude.bit_length() - digits, 0)
    if drop == 0:
        return x
    kept, rest = divmod(magnitude, 1 << drop)
    half = 1 << (drop - 1)
    if rest > half or (rest == half and kept & 1):
        kept += 1
    return (kept << drop) * (1 if x >= 0 else -1)


def _update_from(start: int, dtype: torch.dtype) -> int:
    plus_one = _to_dtype(start + 1, dtype)
    if plus_one < start:
        n = abs(start + 1).bit_length() - 1
        return plus_one + (1 << (n - _digits(dtype) + 1))
    return start


def _update_to(to: int, dtype: torch.dtype) -> int:
    minus_one = _to_dtype(to - 1, dtype)
    if minus_one >= to:
        n = abs(to - 1).bit_length() - 1
        return minus_one - (1 << (n - _digits(dtype) + 1))
    return to


def _real_layout(drawn: Drawn) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Sizes, strides and itemsize of what the kernel writes (complex: its view_as_real)."""
    dtype = drawn.dtype
    if isinstance(drawn, TensorInfo):
        size, stride = drawn.size, drawn.stride
    else:  # a real, fake or meta tensor
        size, stride = tuple(drawn.size()), tuple(drawn.stride())
    if dtype.is_complex:
        return (*size, 2), (*(2 * s for s in stride), 1), dtype.itemsize // 2
    return size, stride, dtype.itemsize


# ------------------------------------------------------- TensorIterator geometry


def launch_numels(size: tuple[int, ...], stride: tuple[int, ...], itemsize: int) -> list[int]:
    """The numel of each ``calc_execution_policy`` a nullary kernel makes for this output.

    One entry when the iterator can use 32-bit indexing; otherwise the whole
    tensor's, then one per sub-iterator of ``with_32bit_indexing()``.
    """
    numel = math.prod(size)
    if numel == 0:
        return []
    shape, strides = _iterator_geometry(size, stride, itemsize)
    if _can_use_32bit_indexing(shape, strides):
        return [numel]
    return [numel, *_sub_launches(tuple(shape), tuple(strides))]


def _iterator_geometry(
    size: Sequence[int], stride: Sequence[int], itemsize: int
) -> tuple[list[int], list[int]]:
    """TensorIterator's shape and byte strides, fastest dimension first."""
    if not size:
        return [], []
    if _non_overlapping_and_dense(size, stride):  # fast_set_up: one dimension
        return [math.prod(size)], [itemsize]
    strides = [s * itemsize for s in stride]
    perm = _reorder(list(size), strides)
    shape = [size[p] for p in perm]
    strides = [strides[p] for p in perm]
    _coalesce(shape, strides)
    return shape, strides


def _non_overlapping_and_dense(size: Sequence[int], stride: Sequence[int]) -> bool:
    """c10's ``is_non_overlapping_and_dense`` (an empty tensor is contiguous, so dense)."""
    if 0 in size:
        return True
    if len(size) == 1:
        return size[0] < 2 or stride[0] == 1
    order = sorted(range(len(size)), key=lambda d: (size[d] < 2, stride[d] if size[d] >= 2 else 0))
    required = 1
    for d in order:
        if size[d] < 2:
            return True
        if stride[d] != required:
            return False
        required *= size[d]
    return True


def _reorder(shape: list[int], strides: list[int]) -> list[int]:
    """``reorder_dimensions`` for one output operand: ascending strides, by insertion sort."""
    n = len(shape)
    perm = list(range(n - 1, -1, -1))

    def should_swap(d0: int, d1: int) -> int:
        s0, s1 = strides[d0], strides[d1]
        if s0 == 0 or s1 == 0:
            return 0
        if s0 != s1:
            return -1 if s0 < s1 else 1
        return 1 if shape[d0] > shape[d1] else 0

    for i in range(1, n):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    return perm


def _coalesce(shape: list[int], strides: list[int]) -> None:
    """``coalesce_dimensions`` in place."""
    if len(shape) <= 1:
        return
    prev = 0
    for dim in range(1, len(shape)):
        if shape[prev] == 1 or shape[dim] == 1 or shape[prev] * strides[prev] == strides[dim]:
            if shape[prev] == 1:
                strides[prev] = strides[dim]
            shape[prev] *= shape[dim]
        else:
            prev += 1
            if prev != dim:
                strides[prev] = strides[dim]
                shape[prev] = shape[dim]
    del shape[prev + 1 :], strides[prev + 1 :]


def _can_use_32bit_indexing(shape: Sequence[int], strides: Sequence[int]) -> bool:
    if math.prod(shape) > _INT32_MAX:
        return False
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides)) <= _INT32_MAX


@functools.lru_cache(maxsize=4096)
def _sub_launches(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """Numels of ``SplitUntil32Bit``'s sub-iterators (halves of the widest dimension)."""
    if _can_use_32bit_indexing(shape, strides):
        return (math.prod(shape),)
    dim = _dim_to_split(shape, strides)
    first = shape[dim] // 2
    return _sub_launches(*_narrow(shape, strides, dim, first)) + _sub_launches(
        *_narrow(shape, strides, dim, shape[dim] - first)
    )


def _dim_to_split(shape: Sequence[int], strides: Sequence[int]) -> int:
    best, extent_max = -1, -1
    for dim in range(len(shape) - 1, -1, -1):
        if shape[dim] == 0:
            continue
        extent = (shape[dim] - 1) * abs(strides[dim])
        if extent > extent_max:
            best, extent_max = dim, extent
    return best


def _narrow(
    shape: Sequence[int], strides: Sequence[int], dim: int, size: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    new_shape, new_strides = list(shape), list(strides)
    new_shape[dim] = size
    if size == 1:  # narrow() re-coalesces a dimension it shrank to one
        _coalesce(new_shape, new_strides)
    return tuple(new_shape), tuple(new_strides)
