"""CUDA Philox offsets: the launch arithmetic, and (with a GPU) the real generator."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from torchdefer.rng import philox

H100 = philox.DeviceShape(multi_processor_count=132, max_threads_per_multi_processor=2048)


@given(numel=st.integers(1, 1 << 34), unroll=st.sampled_from([2, 4]))
def test_each_thread_reserves_four_offsets_per_round_of_its_grid_stride_loop(numel, unroll):
    increment = philox.counter_increment(numel, unroll, H100)
    threads = 256 * min(132 * 8, -(-numel // 256))
    rounds = -(-numel // (threads * unroll))  # ceil: values per thread / values per call
    assert increment == 4 * rounds
    assert increment % 4 == 0


def test_small_tensors_take_one_round_on_any_device():
    for shape in (H100, philox.DeviceShape(8, 1024)):
        assert philox.counter_increment(1, 4, shape) == 4
        assert philox.counter_increment(0, 4, shape) == 0


def test_unroll_follows_the_drawn_dtype_and_integer_range():
    normal = torch.ops.aten.normal_.default
    assert philox.unroll_factor(normal, torch.empty(4, device="meta"), None) == 4
    assert philox.unroll_factor(normal, torch.empty(4, dtype=torch.float64, device="meta"), None) == 2
    random_ = torch.ops.aten.random_.default
    int64 = torch.empty(4, dtype=torch.int64, device="meta")
    assert philox.unroll_factor(random_, int64, None) == 2
    assert philox.unroll_factor(random_, int64, 100) == 4
    assert philox.unroll_factor(random_, int64, 1 << 30) == 2
    assert philox.unroll_factor(torch.ops.aten.randperm.default, int64, None) is None


def test_state_offset_round_trips():
    state = torch.zeros(16, dtype=torch.uint8)
    state[:8].view(torch.int64).fill_(1234)
    moved = philox.with_offset(state, 4096)
    assert philox.offset_of(moved) == (1234, 4096)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("numel", [1, 1000, 10**6, 3 * 10**7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_predicted_offsets_match_the_cuda_generator(numel, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = philox.DeviceShape.of(torch.device("cuda"))
    for op in (torch.Tensor.normal_, torch.Tensor.uniform_):
        t = torch.empty(numel, dtype=dtype, device="cuda")
        before = philox.offset_of(g.get_state())[1]
        op(t, generator=g)
        after = philox.offset_of(g.get_state())[1]
        unroll = philox.unroll_factor(torch.ops.aten.normal_.default, t, None)
        assert after - before == philox.counter_increment(numel, unroll, shape)
