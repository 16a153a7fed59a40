"""CUDA generators: Philox offsets, moved by arithmetic.

A CUDA generator is a Philox counter: a seed and an offset (its
``get_state()`` is 16 bytes: seed u64, offset i64; ``CUDAGeneratorImpl``). A
distribution kernel launched on ``numel`` elements reserves ``counter_offset``
from the offset before it runs (``calc_execution_policy`` in
``aten/src/ATen/native/cuda/DistributionTemplates.h``;
``CUDAGeneratorImpl::philox_cuda_state`` rounds it up to a multiple of 4)::

    grid    = min(multiProcessorCount * (maxThreadsPerMultiProcessor // 256),
                  ceil(numel / 256))
    counter = ((numel - 1) // (256 * grid * unroll) + 1) * 4
    offset += ceil(counter / 4) * 4

``unroll`` is how many values one ``curand4``-style call yields (4 or 2).
Reaching any position is an addition: no jump-ahead needed. Which ops launch
how many such kernels, with which unroll, is the table in
``torchdefer.rng.cuda_increments``; the two device properties are those of
the device the op runs on (:class:`DeviceShape`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchdefer.errors import UsageError

__all__ = ["STATE_BYTES", "DeviceShape", "counter_increment", "offset_of", "state", "with_offset"]

_BLOCK = 256
_CALLS = 4  # max generator offsets one curand_* call consumes
STATE_BYTES = 16


@dataclass(frozen=True, slots=True)
class DeviceShape:
    """The two device properties the launch grid depends on.

    ``of(device)`` reads them with ``torch.cuda.get_device_properties`` (a MIG
    slice reports its own SM count); tests on a host without CUDA build one
    by hand or patch that function.
    """

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
    # dim3's x is 32 bits: ceil(numel / 256) wraps from 2**40 elements on.
    blocks = ((numel + _BLOCK - 1) // _BLOCK) & 0xFFFFFFFF
    grid = min(shape.multi_processor_count * blocks_per_sm, blocks)
    if grid == 0:
        raise UsageError(f"a CUDA launch over {numel} elements has an empty grid with {shape}; "
                         "a DeviceShape needs multi_processor_count >= 1 and "
                         f"max_threads_per_multi_processor >= {_BLOCK}")
    counter = ((numel - 1) // (_BLOCK * grid * unroll) + 1) * _CALLS
    return (counter + 3) // 4 * 4


def offset_of(state: torch.Tensor) -> tuple[int, int]:
    """``(seed, offset)`` of a CUDA generator state (16 bytes: seed, offset)."""
    seed, offset = state[:16].view(torch.int64).tolist()
    return seed & ((1 << 64) - 1), offset


def with_offset(state: torch.Tensor, offset: int) -> torch.Tensor:
    """``state`` with its offset replaced."""
    out = state.clone()
    out[8:16].view(torch.int64).fill_(offset)
    return out


def state(seed: int, offset: int = 0) -> torch.Tensor:
    """The ``get_state()`` of a CUDA generator at ``(seed, offset)`` (built on the CPU).

    ``state(s)`` is a generator just seeded with ``s`` (``manual_seed`` sets the
    offset to 0); no CUDA device is needed to build it.
    """
    words = torch.tensor([seed - (1 << 64) if seed >= 1 << 63 else seed, offset], dtype=torch.int64)
    return words.view(torch.uint8).clone()
