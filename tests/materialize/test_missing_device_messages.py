"""A missing device is named as the one asked for (issue 24, class 5).

A model recorded on the CPU and materialized with ``device="cuda"`` on a host
without CUDA used to say "Tensor 'weight' was recorded on 'cuda'"; the
message names the recorded device and the one ``device=`` asked for.
"""

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.materialize import DeviceUnavailableError

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")


@needs_no_cuda
@pytest.mark.parametrize("how", ["module", "tensor"])
def test_a_cpu_model_materialized_on_missing_cuda_names_both_devices(how):
    model = torchdefer.deferred_init(nn.Linear, 3, 2)
    with pytest.raises(DeviceUnavailableError) as caught:
        if how == "module":
            torchdefer.materialize_module(model, device="cuda")
        else:
            torchdefer.materialize_tensor(model.weight, device="cuda")
    message = str(caught.value)
    assert "was recorded on 'cpu' and is to be materialized on 'cuda" in message, message
    assert "device='cpu'" in message  # what to do
    assert torchdefer.is_deferred(model)  # nothing half-done
    torchdefer.materialize_module(model, device="cpu")
    assert not torchdefer.is_deferred(model)


@needs_no_cuda
def test_a_cuda_model_without_device_names_the_recorded_device():
    model = torchdefer.deferred_init(nn.Linear, 3, 2, device="cuda")
    with pytest.raises(DeviceUnavailableError, match=r"was recorded on 'cuda:0', which this "):
        torchdefer.materialize_module(model)
