"""CUDA generators: Philox offsets, moved by arithmetic.

A CUDA generator is a Philox counter: a seed and an offset. A distribution
kernel launched on ``numel`` elements reserves ``counter_offset`` from the
offset before it runs (``calc_execution_policy`` and ``philox_cuda_state`` in
``aten/src/ATen/native/cuda/DistributionTemplates.h`` and
``CUDAGeneratorImpl.cpp``)::

    grid    = min(multiProcessorCount * (maxThreadsPerMultiProcessor // 256),
                  ceil(numel / 256))
    counter = ((numel - 1) // (256 * grid * unroll) + 1) * 4
    offset += ceil(counter / 4) * 4

``unroll`` is how many values one ``curand4``-style call yields: 4 for
float/half/bfloat16 (and 32-bit integer draws), 2 for float64 and 64-bit
integer draws. Reaching any position is an addition: no jump-ahead needed.

Covered: the ops that launch ``distribution_nullary_kernel`` (``normal_``,
``uniform_``, ``random_``, ``bernoulli_`` with a float ``p``,
``exponential_``, ``geometric_``, ``cauchy_``, ``log_normal_`` and their
factory forms). Others (``randperm``, fused dropout, ``bernoulli_`` with a
tensor ``p``, tensors too large for 32-bit indexing, which launch several
kernels) are unmodeled: their positions are reached by running them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DeviceShape", "counter_increment", "offset_of", "unroll_factor", "with_offset"]

_BLOCK = 256
_CALLS = 4  # max generator offsets one curand_* call consumes
_aten = torch.ops.aten


@dataclass(frozen=True, slots=True)
class DeviceShape:
    """The two device properties the launch grid depends on."""

    multi_processor_count: int
    max_threads_per_multi_processor: int

    @staticmethod
    def of(device: torch.device) -> DeviceShape:
        props = torch.cuda.get_device_properties(device)
        return DeviceShape(props.multi_processor_count, props.max_threads_per_multi_processor)


def counter_increment(numel: int, unroll: int, shape: DeviceShape) -> int:
    """How far one ``distribution_nullary_kernel`` launch moves the offset."""
    if numel == 0:
        return 0
    blocks_per_sm = shape.max_threads_per_multi_processor // _BLOCK
    grid = min(shape.multi_processor_count * blocks_per_sm, (numel + _BLOCK - 1) // _BLOCK)
    counter = ((numel - 1) // (_BLOCK * grid * unroll) + 1) * _CALLS
    return (counter + 3) // 4 * 4


_NULLARY = frozenset(
    {
        _aten.normal_, _aten.normal, _aten.randn, _aten.randn_like, _aten.uniform_,
        _aten.uniform, _aten.rand, _aten.rand_like, _aten.random_, _aten.random,
        _aten.randint, _aten.randint_like, _aten.exponential_, _aten.exponential,
        _aten.geometric_, _aten.geometric, _aten.cauchy_, _aten.cauchy, _aten.log_normal_,
        _aten.log_normal,
    }
)  # fmt: skip
_BERNOULLI_SCALAR = frozenset({_aten.bernoulli_.float, _aten.bernoulli.p})
_INT64_MIN = -(1 << 63)


def unroll_factor(func: Any, drawn: torch.Tensor, range_: int | None) -> int | None:
    """Values per curand call for ``func`` writing ``drawn``; None if not a nullary kernel.

    ``range_`` is the integer range of ``random_``/``randint`` draws (None for
    ``random_()`` without bounds).
    """
    packet = func.overloadpacket
    if packet not in _NULLARY and func not in _BERNOULLI_SCALAR:
        return None
    if drawn.numel() * drawn.element_size() >= 1 << 31:
        return None  # split into several launches for 32-bit indexing
    double = drawn.dtype == torch.float64
    if packet in (_aten.random_, _aten.random, _aten.randint, _aten.randint_like):
        if range_ is None:  # random_(): 64-bit draws for double and int64
            wide = double or drawn.dtype == torch.int64
        else:  # from/to: 64-bit draws from 2**28 on (CUDA's own threshold)
            wide = range_ >= 1 << 28
        return 2 if wide else 4
    return 2 if double else 4


def offset_of(state: torch.Tensor) -> tuple[int, int]:
    """``(seed, offset)`` of a CUDA generator state (16 bytes: seed, offset)."""
    seed, offset = state[:16].view(torch.int64).tolist()
    return seed & ((1 << 64) - 1), offset


def with_offset(state: torch.Tensor, offset: int) -> torch.Tensor:
    out = state.clone()
    out[8:16].view(torch.int64).fill_(offset)
    return out
