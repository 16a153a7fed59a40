"""Which default generator a device draws from, on hosts with fewer GPUs than a program names."""

from __future__ import annotations

import torch

from torchdefer.rng._ledger import default_generator


def test_cpu_draws_from_the_cpu_default_generator():
    assert default_generator(torch.device("cpu")) is torch.default_generator


def test_cuda_indices_this_host_lacks_have_no_generator_and_bare_cuda_is_the_current_device(
    monkeypatch,
):
    # A one-GPU host (as an H200 machine showed: cuda:1 raised a bare IndexError).
    generators = (object(), object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "default_generators", generators)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert default_generator(torch.device("cuda", 0)) is generators[0]
    assert default_generator(torch.device("cuda")) is generators[1]  # as eager: the current one
    assert default_generator(torch.device("cuda", 2)) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_generator(torch.device("cuda", 0)) is None


def test_cuda_generators_are_found_before_cuda_is_initialized(monkeypatch):
    # torch.cuda.default_generators is () until CUDA's lazy init (an H100 run:
    # recording "cuda:0" first in a process raised a bare IndexError). Eager's
    # first draw there initializes CUDA; so does looking its generator up.
    generator = object()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "default_generators", ())
    monkeypatch.setattr(torch.cuda, "init",
                        lambda: monkeypatch.setattr(torch.cuda, "default_generators", (generator,)))
    assert default_generator(torch.device("cuda", 0)) is generator
