"""Random ops with tensor parameters: the fake output has eager's strides, any input layout."""

import pytest
import torch

import torchdefer
from parity import assert_same_tensor
from torchdefer.recorder import RecordingError

_aten = torch.ops.aten
OPS = {
    "normal_tensor_tensor_mean": lambda x: torch.normal(x, torch.ones(x.shape)),
    "normal_tensor_tensor_std": lambda x: torch.normal(torch.zeros(x.shape), x),
    "normal_tensor_tensor_both": lambda x: torch.normal(x, x),
    "normal_tensor_float": lambda x: torch.normal(x, 2.0),
    "normal_float_tensor": lambda x: torch.normal(2.0, x),
    "normal_broadcast": lambda x: torch.normal(x[..., :1], x[:1]),
    "poisson": torch.poisson,
    "standard_gamma": torch._standard_gamma,
    "rrelu": lambda x: torch.rrelu(x - 0.75, training=True),
    # the mask (the output's size-1 dims follow elementwise ops' rules, not a random op's)
    "native_dropout_mask": lambda x: torch.native_dropout(x, 0.3, True)[1],
}
LAYOUTS = {
    "transposed": lambda shape: torch.full(shape[::-1], 0.5).permute(*range(len(shape))[::-1]),
    "stepped": lambda shape: torch.full((*shape[:-1], 2 * shape[-1]), 0.5)[..., ::2],
    "expanded": lambda shape: torch.full((1,) * len(shape), 0.5).expand(shape),
    "channels_last": lambda shape: torch.full(shape, 0.5).to(memory_format=torch.channels_last),
}
SHAPES = [(20, 4), (1, 5), (5, 1), (2, 3, 4, 5), (2, 1, 4, 1)]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(OPS))
def test_random_op_outputs_are_row_major_as_eagers_for_any_input_layout(name, layout):
    for shape in SHAPES:
        if layout == "channels_last" and len(shape) != 4:
            continue

        def build(shape=shape):
            out = OPS[name](LAYOUTS[layout](shape))
            return out, torch.rand(3)  # the draw after it must start where eager's does

        torch.manual_seed(0)
        eager = build()
        ref_state = torch.get_rng_state()
        torch.manual_seed(0)
        if name == "standard_gamma" and not _has_meta("aten::_standard_gamma"):
            # torch 2.8: no meta kernel, so recording it is refused, naming the op
            with pytest.raises(RecordingError, match="aten._standard_gamma"):
                torchdefer.deferred_init(build)
            continue
        deferred = torchdefer.deferred_init(build)
        assert torch.equal(torch.get_rng_state(), ref_state), shape
        assert deferred[0].stride() == eager[0].stride(), shape  # what user code sees
        for d, e in zip(reversed(deferred), reversed(eager), strict=True):
            assert_same_tensor(torchdefer.materialize_tensor(d), e, f"{name} {shape}")


def test_normal_with_a_transposed_mean_and_std_replays_as_eager():
    """Issue 24's report: replay refused with "draw model is wrong"."""

    def build():
        mean = torch.zeros(20, 4).t()
        std = torch.ones(20, 4).t()
        return torch.normal(mean, std), torch.normal(2.0, std), torch.randn(5)

    torch.manual_seed(3)
    eager = build()
    torch.manual_seed(3)
    deferred = torchdefer.deferred_init(build)
    for d, e in zip(deferred, eager, strict=True):
        assert_same_tensor(torchdefer.materialize_tensor(d), e)


@pytest.mark.parametrize(
    ("train", "p", "shape"),
    [(False, 0.3, (4, 5)), (True, 0.0, (4, 5)), (None, 0.0, (4, 5)), (True, 1.0, (4, 5)),
     (True, 0.3, (0, 5)), (False, 0.3, (0, 5))],
)  # fmt: skip
def test_native_dropout_output_is_the_input_exactly_when_eagers_is(train, p, shape):
    """The meta decomposition returned the input itself when not training or at
    p=0: a write to the output reached the input (a silent wrong value)."""

    def build():
        x = torch.ones(shape[::-1]).t()
        y, mask = torch.native_dropout(x, p, train)
        y.mul_(3)
        return x, y, mask, torch.rand(2)

    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    assert (deferred[1] is deferred[0]) == (eager[1] is eager[0])
    for d, e in zip(deferred, eager, strict=True):
        assert_same_tensor(torchdefer.materialize_tensor(d), e)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("shape", [(1, 5), (0, 5), (4, 5)])
def test_native_dropout_on_fake_cuda_follows_the_cuda_kernel(shape, train):
    """native_dropout_cuda: empty_like(input) outputs and a bool mask, a clone when
    not training; no shortcut for an empty input (aten/src/ATen/native/cuda/Dropout.cu)."""
    with torchdefer.fake_mode():
        x = torch.ones(shape[::-1], device="cuda").t()
        out, mask = torch.native_dropout(x, 0.3, train)
    assert out is not x and mask.dtype == torch.bool
    assert out.stride() == mask.stride() == torch.empty_like(torch.ones(shape[::-1]).t()).stride()


@pytest.mark.parametrize("like", [torch.rand_like, torch.randn_like, torch.empty_like, torch.clone])
@pytest.mark.parametrize("shape", [(3, 0), (0, 5), (2, 0, 3)])
def test_like_factories_of_an_empty_strided_tensor_keep_its_strides_as_eager(like, shape):
    """An empty tensor is non-overlapping and dense to torch: empty_like keeps its strides."""

    def build():
        return like(torch.ones(shape[::-1]).permute(*range(len(shape))[::-1]))

    eager = build()
    deferred = torchdefer.deferred_init(build)
    assert deferred.stride() == eager.stride()
    assert_same_tensor(torchdefer.materialize_tensor(deferred), eager)


def _has_meta(op: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, "Meta")
