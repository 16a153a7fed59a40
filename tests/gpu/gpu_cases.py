"""The probe's cases: every row of the CUDA increment table at the sizes that tell rows apart.

A case is one op on one dtype and one layout: how to run it eagerly from a
generator, and the aten call the model sees (``torchdefer.rng.cuda_increments``).
Sizes are ``0, 1, T, T+1, 2T+1, 8T+1`` with ``T`` the device's grid x block
(where unroll 4 and 2, and one and several grid rounds, part), plus a
non-dense view and a strided view whose byte extent passes 2**31 - 1 (few
elements, several 32-bit sub-launches). Ops left to run by the model are
measured too: the probe reports their increments, so a GPU run can turn one
into a counted row. Nothing here needs a GPU; ``gpu_probe.py`` runs the cases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from torchdefer.rng import cuda_increments
from torchdefer.rng.philox import DeviceShape

aten = torch.ops.aten

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.complex128,
]  # fmt: skip
WIDE_EXTENT = 1 << 31  # bytes between a strided view's first and last element


@dataclass(frozen=True, slots=True)
class Op:
    """One row's op: eager call on a tensor ``t`` from generator ``g``, and its aten form."""

    name: str
    row: str  # the table row it checks
    run: Callable[[torch.Tensor, torch.Generator], Any]
    func: Any  # the aten overload the recorder would see
    args: Callable[[torch.Tensor], tuple]  # its arguments, from the drawn tensor
    counted: bool = True


RANDOM_FROM = getattr(aten.random_, "from")
OPS = [
    Op("normal_", "normal/uniform", lambda t, g: t.normal_(generator=g), aten.normal_.default,
       lambda t: (t,)),
    Op("uniform_", "normal/uniform", lambda t, g: t.uniform_(generator=g), aten.uniform_.default,
       lambda t: (t,)),
    Op("log_normal_", "real-only", lambda t, g: t.log_normal_(generator=g),
       aten.log_normal_.default, lambda t: (t,)),
    Op("exponential_", "real-only", lambda t, g: t.exponential_(generator=g),
       aten.exponential_.default, lambda t: (t,)),
    Op("cauchy_", "real-only", lambda t, g: t.cauchy_(generator=g), aten.cauchy_.default,
       lambda t: (t,)),
    Op("geometric_", "real-only", lambda t, g: t.geometric_(0.5, generator=g),
       aten.geometric_.default, lambda t: (t, 0.5)),
    Op("bernoulli_(p float)", "bernoulli float p", lambda t, g: t.bernoulli_(0.3, generator=g),
       aten.bernoulli_.float, lambda t: (t, 0.3)),
    Op("random_()", "random_()", lambda t, g: t.random_(generator=g), aten.random_.default,
       lambda t: (t,)),
    Op("random_(0, 100)", "random_(from, to)", lambda t, g: t.random_(0, 100, generator=g),
       RANDOM_FROM, lambda t: (t, 0, 100)),
    Op("random_(0, 2**30)", "random_(from, to)",
       lambda t, g: t.random_(0, 1 << 30, generator=g), RANDOM_FROM, lambda t: (t, 0, 1 << 30)),
    Op("random_(0, None)", "random_(from, None)", lambda t, g: t.random_(0, None, generator=g),
       RANDOM_FROM, lambda t: (t, 0, None)),
    Op("random_(min, None)", "random_(INT64_MIN, None)",
       lambda t, g: t.random_(-(1 << 63), None, generator=g), RANDOM_FROM,
       lambda t: (t, -(1 << 63), None)),
    # Left to run: measured, never predicted.
    Op("bernoulli_(p tensor)", "run", lambda t, g: t.bernoulli_(torch.full_like(t, 0.3,
       dtype=torch.float32), generator=g), aten.bernoulli_.Tensor, lambda t: (t, t),
       counted=False),
    Op("dropout", "run", lambda t, g: _with_default(g, lambda: F.dropout(t, 0.5, True)),
       aten.native_dropout.default, lambda t: (t, 0.5, True), counted=False),
    Op("rrelu", "run", lambda t, g: _with_default(g, lambda: F.rrelu(t, training=True)),
       aten.rrelu_with_noise.default,
       lambda t: (t, t), counted=False),
    Op("poisson", "run", lambda t, g: torch.poisson(t.abs(), generator=g), aten.poisson.default,
       lambda t: (t,), counted=False),
    Op("_standard_gamma", "run", lambda t, g: torch._standard_gamma(t.abs() + 1, generator=g),
       aten._standard_gamma.default, lambda t: (t,), counted=False),
    Op("binomial", "run", lambda t, g: torch.binomial(t.abs() + 3, t.abs() * 0 + 0.5,
       generator=g), aten.binomial.default, lambda t: (t, t), counted=False),
    Op("multinomial", "run", lambda t, g: torch.multinomial(t.reshape(-1).abs() + 1, 1,
       generator=g), aten.multinomial.default, lambda t: (t, 1), counted=False),
    Op("randperm", "run", lambda t, g: torch.randperm(t.numel(), device=t.device, generator=g),
       aten.randperm.generator, lambda t: (t.numel(),), counted=False),
]  # fmt: skip


def _with_default(g: torch.Generator, call: Callable[[], Any]) -> Any:
    """Run ``call`` (an op without a generator argument) on ``g``'s state via the default one."""
    default = torch.cuda.default_generators[g.device.index or 0]
    saved = default.get_state()
    default.set_state(g.get_state())
    try:
        return call()
    finally:
        g.set_state(default.get_state())
        default.set_state(saved)


@dataclass(frozen=True, slots=True)
class Layout:
    label: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_bytes: int  # what to allocate for it


def threads(shape: DeviceShape) -> int:
    """T: the threads of one full grid of ``distribution_nullary_kernel``."""
    return shape.multi_processor_count * (shape.max_threads_per_multi_processor // 256) * 256


def layouts(shape: DeviceShape, dtype: torch.dtype) -> list[Layout]:
    t = threads(shape)
    item = dtype.itemsize
    out = [Layout(label, (n,), (1,), n * item) for label, n in
           [("0", 0), ("1", 1), ("T", t), ("T+1", t + 1), ("2T+1", 2 * t + 1), ("8T+1", 8 * t + 1)]]
    rows, cols = 513, 300  # a transposed slice: TensorIterator reorders, cannot collapse
    out.append(Layout("513x300 view .t()[::2]", (cols // 2, rows), (2, cols), rows * cols * item))
    step = -(-WIDE_EXTENT // item)  # > 2**31 - 1 bytes between rows: sub-launches
    out.append(Layout("2x3 rows 2GiB apart", (2, 3), (step, 1), (step + 3) * item))
    return out


@dataclass(frozen=True, slots=True)
class Case:
    op: Op
    dtype: torch.dtype
    layout: Layout

    def predicted(self, shape: DeviceShape) -> int | None:
        """The model's increment (None: the model runs it); raises if eager would refuse."""
        drawn = torch.empty(0, dtype=self.dtype, device="meta").as_strided(
            self.layout.size, self.layout.stride
        )
        if not self.op.counted:
            return None
        return cuda_increments.increment(self.op.func, self.op.args(drawn), {}, drawn, shape)

    def tensor(self, device: torch.device, pool: dict) -> torch.Tensor:
        """An eager tensor of this layout, over a reused buffer."""
        nbytes = max(self.layout.storage_bytes, 1)
        buffer = pool.get(device)
        if buffer is None or buffer.nbytes() < nbytes:
            pool.clear()
            buffer = pool[device] = torch.UntypedStorage(nbytes, device=device)
        out = torch.empty(0, dtype=self.dtype, device=device)
        out.set_(buffer, 0, self.layout.size, self.layout.stride)
        if self.dtype.is_floating_point or self.dtype.is_complex:
            out.fill_(0.5)  # a valid probability, rate and weight for the run rows
        else:
            out.fill_(1)
        return out


def all_cases(shape: DeviceShape) -> list[Case]:
    return [Case(op, dtype, layout) for op in OPS for dtype in DTYPES
            for layout in layouts(shape, dtype)]
