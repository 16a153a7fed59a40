"""torchdefer's own tensors name their device and dtype: ambient settings change nothing.

The process-wide probes (the draw model's measurements, mt19937's layout, the
bounds proof's premises, the trunc_normal_ checks) and the RNG sync when a
recording ends run whatever device context or default dtype the user has in
force; each must answer as it would in a clean context (issue 24, class 1).
"""

import pytest
import torch
from torch import nn

import torchdefer
from parity import trunc_normal_reads_data
from torchdefer.recorder import _trunc_normal
from torchdefer.recorder._composite import _reads_data
from torchdefer.rng import _bounds as bounds
from torchdefer.rng import _ranges as ranges
from torchdefer.rng import _rejection as rejection
from torchdefer.rng import draws, mt19937


def _forget_every_probe():
    for cached in (draws._measured, mt19937.layout_known, bounds.premises_hold,
                   rejection.chunks_match, _trunc_normal._draws_one_normal,
                   _trunc_normal._rows_match, _trunc_normal._proven, _reads_data):  # fmt: skip
        cached.cache_clear()
    ranges._checked.clear()


def build():
    lin = nn.Linear(40, 24, device="cpu")
    nn.init.trunc_normal_(lin.weight, std=0.02)
    out = nn.Linear(40, 30, device="cpu", bias=False)
    nn.init.trunc_normal_(out.weight, std=0.2, a=-0.6, b=0.6)
    return nn.Sequential(lin, out)


@pytest.mark.parametrize("ambient", ["cuda", "meta"])
def test_first_recording_of_a_process_in_a_device_context_matches_eager(ambient):
    torch.manual_seed(0)
    eager = build()
    eager_state = torch.get_rng_state()
    _forget_every_probe()
    torch.manual_seed(0)
    with torch.device(ambient):
        model = torchdefer.deferred_init(build)
    _check(model, eager, eager_state)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_first_recording_of_a_process_under_a_default_dtype_matches_eager(dtype):
    try:
        torch.set_default_dtype(dtype)
        torch.manual_seed(0)
        eager = build()
        eager_state = torch.get_rng_state()
        _forget_every_probe()
        torch.manual_seed(0)
        model = torchdefer.deferred_init(build)
    finally:
        torch.set_default_dtype(torch.float32)
    _check(model, eager, eager_state)


def _check(model, eager, eager_state):
    assert torch.equal(torch.get_rng_state(), eager_state)
    if trunc_normal_reads_data():  # the rejection loop (torch >= 2.12) proven one normal_
        assert model[0].weight._value.node.op is torch.ops.aten.normal_.default
    torchdefer.materialize_module(model)
    for got, want in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(got, want)
