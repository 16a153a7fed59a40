"""CUDA Philox offsets: the launch arithmetic, and (with a GPU) the real generator."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from torchdefer.rng import cuda_increments, philox

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


def test_state_offset_round_trips():
    state = torch.zeros(16, dtype=torch.uint8)
    state[:8].view(torch.int64).fill_(1234)
    moved = philox.with_offset(state, 4096)
    assert philox.offset_of(moved) == (1234, 4096)


@pytest.mark.parametrize("seed", [0, 1234, (1 << 63) + 5, (1 << 64) - 1])
def test_a_built_state_reads_back_its_seed_and_offset(seed):
    assert philox.offset_of(philox.state(seed, 64)) == (seed, 64)
    assert philox.state(seed).shape == (philox.STATE_BYTES,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_built_state_is_what_manual_seed_leaves_in_a_cuda_generator():
    g = torch.Generator(device="cuda").manual_seed(2**40 + 3)
    assert torch.equal(g.get_state(), philox.state(2**40 + 3))


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
        func = torch.ops.aten.normal_.default
        assert after - before == cuda_increments.increment(func, (t,), {}, t, shape)
