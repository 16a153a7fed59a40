"""Every random op on fake CUDA, every dtype and layout: replays as eager, and the Philox model copes.

Each case is recorded on fake CUDA and materialized on the CPU in reverse
order (with a draw after it, so its own count is checked too); it must equal
the same code run eagerly on the CPU. The Philox layout of the same recording
is computed for a fake H100: every op gets a count or is left to run, and
nothing raises. Cases eager refuses are left out (refusing them is the
recorder's business).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fake_cuda_properties import fake_cuda_properties_fixture  # noqa: F401

import torchdefer
from torchdefer.recorder._rng_placement import NODE_READER
from torchdefer.rng._stream import call_effect

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.complex64, torch.complex128]


def _target(layout: str, dtype, device):
    """The tensor drawn into: contiguous, transposed, strided, 0-d or empty."""
    make = {
        "contiguous": lambda: torch.empty(3, 5, dtype=dtype, device=device),
        "transposed": lambda: torch.empty(5, 3, dtype=dtype, device=device).t(),
        "strided": lambda: torch.empty(3, 10, dtype=dtype, device=device)[:, ::2],
        "0-d": lambda: torch.empty((), dtype=dtype, device=device),
        "empty": lambda: torch.empty(0, 5, dtype=dtype, device=device),
    }
    return make[layout]()


def _probabilities(t):
    """A probability tensor broadcast (expanded) to ``t``'s shape."""
    row = torch.full(t.shape[-1:], 0.4, device=t.device) if t.dim() else torch.tensor(0.4, device=t.device)
    return row.expand(t.shape)


OPS = {
    "normal_": lambda t: t.normal_(),
    "uniform_": lambda t: t.uniform_(-1, 1),
    "log_normal_": lambda t: t.log_normal_(),
    "exponential_": lambda t: t.exponential_(),
    "cauchy_": lambda t: t.cauchy_(),
    "geometric_": lambda t: t.geometric_(0.3),
    "bernoulli_(p)": lambda t: t.bernoulli_(0.3),
    "bernoulli_(tensor, expanded)": lambda t: t.bernoulli_(_probabilities(t)),
    "bernoulli(t)": lambda t: torch.bernoulli(_probabilities(t).to(t.dtype)),
    "random_()": lambda t: t.random_(),
    "random_(0, None)": lambda t: t.random_(0, None),
    "random_(2, 9)": lambda t: t.random_(2, 9),
    "randn_like": lambda t: torch.randn_like(t),
    "rand_like": lambda t: torch.rand_like(t),
    "randint_like": lambda t: torch.randint_like(t, 7),
    "normal(mean broadcast, std)": lambda t: torch.normal(_probabilities(t).to(t.dtype), 2.0),
    "normal(mean, std broadcast)": lambda t: torch.normal(
        torch.zeros(t.shape[-1:] if t.dim() else (), dtype=t.dtype, device=t.device),
        _probabilities(t)),
    "dropout": lambda t: F.dropout(t, 0.5, True),
    "poisson": lambda t: torch.poisson(_probabilities(t).to(t.dtype)),
    "multinomial": lambda t: torch.multinomial(t.reshape(-1).abs() + 1, 2, replacement=True),
}
LAYOUTS = ["contiguous", "transposed", "strided", "0-d", "empty"]
# Recording refuses what eager runs (reported, recorder's business): torch's own
# reference for normal(Tensor mean, float std) compares a complex std with 0.
KNOWN_GAPS = {("normal(mean broadcast, std)", torch.complex64),
              ("normal(mean broadcast, std)", torch.complex128)}


def _program(op, layout, dtype):
    def build(device):
        t = _target(layout, dtype, device)
        if t.is_floating_point() or t.is_complex():
            t.fill_(0.25)
        else:
            t.fill_(1)
        out = op(t)
        return out, torch.randn(4, device=device)

    return build


def _eager(build):
    torch.manual_seed(0)
    try:
        return build("cpu")
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return None


def _accepted(op, layout, dtype) -> bool:
    """Whether eager runs the case, on a tensor with elements too.

    Eager returns early on an empty tensor before checking its dtype
    (``normal_`` of an empty bool tensor passes); the meta kernels check
    first, so recording refuses such a call. Known gap of the recorder,
    reported; not this file's subject.
    """
    if _eager(_program(op, layout, dtype)) is None:
        return False
    return layout != "empty" or _eager(_program(op, "contiguous", dtype)) is not None


@pytest.mark.parametrize("name", list(OPS))
def test_every_random_op_replays_from_fake_cuda_and_the_philox_model_copes(
    name, fake_cuda_properties
):
    cuda0 = torch.device("cuda", 0)
    checked = 0
    for dtype in DTYPES:
        for layout in LAYOUTS:
            if (name, dtype) in KNOWN_GAPS or not _accepted(OPS[name], layout, dtype):
                continue
            build = _program(OPS[name], layout, dtype)
            eager = _eager(build)
            torch.manual_seed(0)
            deferred = torchdefer.deferred_init(build, "cuda")
            got = [torchdefer.materialize_tensor(t, device="cpu") for t in reversed(deferred)]
            for a, b in zip(reversed(got), eager, strict=True):
                assert a.dtype == b.dtype and a.shape == b.shape, (name, dtype, layout)
                assert torch.equal(a, b) or (a.isnan() == b.isnan()).all(), (name, dtype, layout)
            for stream in deferred[1]._graph.rng.streams.values():
                for epoch in stream.epochs:
                    for node in epoch.calls:
                        count = call_effect(node, cuda0, NODE_READER)
                        assert count is None or count >= 0, (name, dtype, layout)
            checked += 1
    assert checked, f"eager accepted no case of {name}"
