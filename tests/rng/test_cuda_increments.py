"""The CUDA Philox increment table, checked on the CPU against what PyTorch exposes.

PyTorch's Python side carries the launch arithmetic twice
(``torch._prims.rng_prims.philox_rand_offset`` and inductor's
``replace_random._shape_to_offset``, both copied from
``calc_execution_policy`` for unroll 4), tensor layouts are eager's own (``view_as_real``,
``is_non_overlapping_and_dense``), and integer ranges come from the dtype
limits and from eager ``random_`` on the CPU (the range computation is shared
by both devices). The counts themselves are checked on a GPU by
``make test-gpu`` (tests/gpu).
"""

from __future__ import annotations

import math

import pytest
import torch
from fake_cuda_properties import fake_cuda_properties_fixture  # noqa: F401
from hypothesis import given, settings
from hypothesis import strategies as st

from torchdefer import _compat
from torchdefer.rng import cuda_increments
from torchdefer.rng.philox import DeviceShape, counter_increment

aten = torch.ops.aten
RANDOM_FROM = getattr(aten.random_, "from")
CUDA0 = torch.device("cuda", 0)


def grid_threads(shape: DeviceShape) -> int:
    """T: the threads of a full grid (grid x block)."""
    return shape.multi_processor_count * (shape.max_threads_per_multi_processor // 256) * 256


def probe_sizes(shape: DeviceShape) -> list[int]:
    t = grid_threads(shape)
    return [0, 1, t, t + 1, 2 * t + 1, 8 * t + 1]


def meta(*size, dtype=torch.float32):
    return torch.empty(size, dtype=dtype, device="meta")


def inc(func, drawn, *args, shape, **kwargs):
    return cuda_increments.increment(func, (drawn, *args), kwargs, drawn, shape)


@pytest.mark.parametrize("index", [0, 1])
def test_contiguous_float_draws_match_torch_prims_philox_rand_offset(fake_cuda_properties, index):
    from torch._prims import rng_prims

    shape = DeviceShape.of(torch.device("cuda", index))
    torch.cuda.current_device = lambda: index  # philox_rand_offset asks the current device
    for numel in [*probe_sizes(shape)[1:], 10**6, 1 << 29]:  # its formula divides by 0 at 0
        expected = int(rng_prims.philox_rand_offset((numel,)))
        for func in (aten.uniform_.default, aten.normal_.default, aten.exponential_.default):
            assert inc(func, meta(numel), shape=shape) == expected, (func, numel)


@pytest.mark.parametrize("index", [0, 1])
def test_contiguous_float_draws_match_inductors_offset_for_the_device_they_run_on(
    fake_cuda_properties, index
):
    replace_random = pytest.importorskip("torch._inductor.fx_passes.replace_random")
    _shape_to_offset = getattr(replace_random, "_shape_to_offset", None)
    if _shape_to_offset is None:  # torch 2.8: inductor computes no offset to compare with
        pytest.skip(f"torch {torch.__version__}'s inductor has no _shape_to_offset")

    device = torch.device("cuda", index)
    shape = DeviceShape.of(device)
    for numel in [*probe_sizes(shape), 10**6, 1 << 29]:
        expected = int(_shape_to_offset((numel,), device))
        assert inc(aten.normal_.default, meta(numel), shape=shape) == expected, numel
        assert inc(aten.randn.default, meta(numel), shape=shape) == expected, numel


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64]
)
def test_the_unroll_is_two_only_for_double_draws(fake_cuda_properties, dtype):
    shape = DeviceShape.of(CUDA0)
    n = 8 * grid_threads(shape) + 1  # a size where unroll 2 and 4 differ
    unroll = 2 if dtype == torch.float64 else 4
    for func in (aten.normal_.default, aten.uniform_.default, aten.cauchy_.default,
                 aten.log_normal_.default, aten.geometric_.default, aten.bernoulli_.float):
        assert inc(func, meta(n, dtype=dtype), shape=shape) == counter_increment(n, unroll, shape)


@pytest.mark.parametrize("complex_dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_complex_draws_count_the_reals_of_view_as_real(fake_cuda_properties, complex_dtype, layout):
    shape = DeviceShape.of(CUDA0)
    n = 2 * grid_threads(shape) + 1
    base = meta(n, 8, dtype=complex_dtype)
    drawn = {"contiguous": base, "transposed": base.t(), "strided": base[:, ::3]}[layout]
    real = torch.view_as_real(drawn)  # eager's own view, on meta
    for func in (aten.normal_.default, aten.uniform_.default):
        expected = inc(func, real, shape=shape)
        assert inc(func, drawn, shape=shape) == expected
    # A complex64 draw of n values costs what 2n float32 draws cost (unroll 4, not n at 4).
    if layout == "contiguous" and complex_dtype == torch.complex64:
        as_floats = inc(aten.normal_.default, meta(2 * n * 8), shape=shape)
        assert inc(aten.normal_.default, drawn, shape=shape) == as_floats
        assert as_floats != counter_increment(n * 8, 4, shape)


def _digits(dtype: torch.dtype) -> int:
    return round(-math.log2(torch.finfo(dtype).eps)) + 1


def _max_of(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 1
    if dtype.is_floating_point:
        return 1 << _digits(dtype)
    return torch.iinfo(dtype).max


RANDOM_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                 torch.float16, torch.bfloat16, torch.float32, torch.float64]


FROM_CASES = [(dtype, start) for dtype in RANDOM_DTYPES for start in (0, 1, -100)
              if start >= 0 or (dtype.is_signed and dtype != torch.bool)]


@pytest.mark.parametrize(("dtype", "start"), FROM_CASES)
def test_random_from_none_draws_up_to_the_dtype_maximum(fake_cuda_properties, dtype, start):
    span = _max_of(dtype) - start + 1
    expected = 2 if span >= 1 << 28 else 4
    assert cuda_increments.unroll(RANDOM_FROM, (meta(4, dtype=dtype), start, None), {},
                                  meta(4, dtype=dtype)) == expected
    # The same range on eager's CPU kernel (shared template): values in [from, max].
    values = torch.empty(4096, dtype=dtype).random_(start, None, generator=torch.Generator())
    assert int(values.min()) >= start and int(values.max()) <= _max_of(dtype)


def test_random_from_none_is_unroll_four_for_narrow_dtypes_and_two_for_wide_ones(
    fake_cuda_properties,
):
    shape = DeviceShape.of(CUDA0)
    n = 8 * grid_threads(shape) + 1
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                  torch.int16, torch.bool):
        assert inc(RANDOM_FROM, meta(n, dtype=dtype), 0, None, shape=shape) == counter_increment(
            n, 4, shape), dtype
    for dtype in (torch.int32, torch.int64, torch.float64):
        assert inc(RANDOM_FROM, meta(n, dtype=dtype), 0, None, shape=shape) == counter_increment(
            n, 2, shape), dtype
    full = inc(RANDOM_FROM, meta(n, dtype=torch.float32), -(1 << 63), None, shape=shape)
    assert full == counter_increment(n, 2, shape)  # random_full_64_bits_range_kernel


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "wide"),
    [
        (aten.randint.default, (100, [4]), {}, False),
        (aten.randint.low, (-(1 << 27), 1 << 27, [4]), {}, True),
        (aten.randint.low, (0, (1 << 28) - 1, [4]), {}, False),
        (aten.random_.to, (None, 1 << 28), {}, True),
        (RANDOM_FROM, (None, 5, 1 << 40), {}, True),
        (aten.random_.default, (None,), {}, None),
    ],
)
def test_integer_draws_widen_from_a_range_of_two_to_the_28(func, args, kwargs, wide):
    drawn = meta(4, dtype=torch.int64)
    args = tuple(drawn if a is None else a for a in args)
    expected = 2 if wide or wide is None else 4  # random_() on int64: 64-bit draws
    assert cuda_increments.unroll(func, args, kwargs, drawn) == expected


def test_randint_like_with_a_tensor_high_is_run_not_counted():
    drawn = meta(4, dtype=torch.int64)
    high = torch.tensor(5)
    assert cuda_increments.unroll(aten.randint_like.Tensor, (drawn, high), {}, drawn) is None
    assert cuda_increments.increment(
        aten.randint_like.Tensor, (drawn, high), {}, drawn, DeviceShape(132, 2048)
    ) is None


def test_ops_left_to_run_are_never_counted():
    drawn = meta(8)
    shape = DeviceShape(132, 2048)
    for func, args in [
        (aten.bernoulli_.Tensor, (drawn, meta(8))),
        (aten.bernoulli.default, (drawn,)),
        (aten.randperm.default, (8,)),
        (aten.multinomial.default, (drawn, 2)),
        (aten.native_dropout.default, (drawn, 0.5, True)),
        (aten.poisson.default, (drawn,)),
        (aten._standard_gamma.default, (drawn,)),
        (aten.binomial.default, (drawn, drawn)),
    ]:
        assert cuda_increments.increment(func, args, {}, drawn, shape) is None, func


# ------------------------------------------------------ sizes past 32-bit indexing


def test_a_small_tensor_with_a_byte_extent_past_two_to_the_31_pays_each_sub_launch():
    # 6 elements, but 1 + 2**32 bytes apart: can_use_32bit_indexing fails.
    shape = DeviceShape(132, 2048)
    drawn = meta(2, 3).as_strided((2, 3), (1 << 30, 1))
    assert cuda_increments.launch_numels((2, 3), (1 << 30, 1), 4) == [6, 3, 3]
    assert inc(aten.normal_.default, drawn, shape=shape) == 3 * counter_increment(6, 4, shape)


def test_the_32_bit_limit_is_on_the_last_byte_offset_not_the_byte_count():
    limit = 1 << 29  # float32: 1 + (2**29 - 1) * 4 bytes still fits
    assert cuda_increments.launch_numels((limit,), (1,), 4) == [limit]
    assert cuda_increments.launch_numels((limit + 1,), (1,), 4) == [
        limit + 1, limit // 2, limit // 2 + 1
    ]


@settings(max_examples=200, deadline=None)
@given(
    size=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    steps=st.lists(st.integers(1, 4), min_size=4, max_size=4),
    order=st.permutations(range(4)),
    big=st.integers(0, 3),
    scale=st.sampled_from([1, 1 << 20, 1 << 28]),
)
def test_sub_launches_cover_the_tensor_and_each_fits_32_bit_indexing(size, steps, order, big,
                                                                      scale):
    n = len(size)
    stride = [1] * n
    running = 1
    for d in [d for d in order if d < n]:  # a permuted, gappy layout
        stride[d] = running * steps[d]
        running = stride[d] * size[d]
    stride[big % n] *= scale
    numels = cuda_increments.launch_numels(tuple(size), tuple(stride), 4)
    assert numels[0] == math.prod(size)
    if len(numels) > 1:
        assert sum(numels[1:]) == numels[0]
        assert all(k <= (1 << 31) - 1 for k in numels[1:])


@settings(max_examples=300, deadline=None)
@given(
    size=st.lists(st.integers(0, 4), min_size=1, max_size=4),
    data=st.data(),
)
def test_dense_detection_agrees_with_eager(size, data):
    import torch._prims_common as prims_common

    # torch 2.8 has only the plain name (2.15 only the new one): the same answer for
    # sizes and strides that are ints.
    is_non_overlapping_and_dense_or_false = getattr(
        prims_common, "is_non_overlapping_and_dense_or_false", None
    ) or prims_common.is_non_overlapping_and_dense
    stride = tuple(data.draw(st.integers(0, 30)) for _ in size)
    t = torch.empty(0, device="meta").as_strided(size, stride)
    assert cuda_increments._non_overlapping_and_dense(tuple(size), stride) == (
        is_non_overlapping_and_dense_or_false(t)
    )


@settings(max_examples=300, deadline=None)
@given(
    size=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    steps=st.lists(st.integers(1, 3), min_size=4, max_size=4),
    order=st.permutations(range(4)),
)
def test_dimension_order_is_eager_tensor_iterators(size, steps, order):
    """An out-of-place op lays out its output in TensorIterator's dimension order: compare."""
    n = len(size)
    stride, running = [0] * n, 1
    for d in [d for d in order if d < n]:
        stride[d] = running * steps[d]
        running = stride[d] * size[d]
    x = torch.zeros(running).as_strided(size, stride)
    perm = cuda_increments._reorder(list(size), [s * 4 for s in stride])
    expected, running = [0] * n, 1
    for d in perm:  # fastest first
        expected[d] = running
        running *= size[d]
    got = x.neg().stride()  # eager CPU TensorIterator (dense inputs keep their strides)
    assert all(expected[d] == got[d] for d in range(n) if size[d] > 1)


def test_dense_outputs_are_one_dimension_and_others_keep_their_extent():
    assert cuda_increments._iterator_geometry((4, 5, 6), (1, 24, 4), 4) == ([120], [4])
    shape, strides = cuda_increments._iterator_geometry((4, 6), (12, 1), 4)
    assert (shape, strides) == ([6, 4], [4, 48])  # fastest dimension first
    assert cuda_increments._iterator_geometry((), (), 4) == ([], [])


# --------------------------------------------------------------- versions


@pytest.mark.parametrize(
    ("version", "applies"),
    [("2.8.0", True), ("2.13.0+cpu", True), ("2.15.1+cu132", True), ("2.7.1", False),
     ("2.16.0", False), ("3.0.0", False), ("garbage", False)],
)
def test_the_table_is_trusted_only_on_the_releases_it_was_written_for(version, applies):
    assert _compat.philox_table_applies(version) is applies


def test_outside_those_releases_every_cuda_draw_is_run(monkeypatch):
    monkeypatch.setattr(_compat, "philox_table_applies", lambda version=None: False)
    drawn = meta(8)
    assert inc(aten.normal_.default, drawn, shape=DeviceShape(132, 2048)) is None


def test_rng_jumps_off_runs_every_cuda_draw(monkeypatch):
    monkeypatch.setenv("TORCHDEFER_RNG_JUMPS", "0")
    assert inc(aten.normal_.default, meta(8), shape=DeviceShape(132, 2048)) is None
