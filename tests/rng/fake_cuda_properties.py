"""Fake CUDA device properties: the seam the Philox model reads (tests on a host without CUDA).

A module, not a conftest: sibling test folders have conftests of their own,
and two ``conftest`` modules on the path collide. Import the fixture.
"""

from __future__ import annotations

import types

import pytest
import torch

# (multiProcessorCount, maxThreadsPerMultiProcessor): an H100 SXM as cuda:0 and
# a small part (a MIG slice, an older card) as cuda:1.
FAKE_DEVICES = {0: (132, 2048), 1: (14, 1024)}


def _index(device) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    return torch.device(device).index or 0


@pytest.fixture(name="fake_cuda_properties")
def fake_cuda_properties_fixture(monkeypatch):
    """``torch.cuda.get_device_properties`` answers FAKE_DEVICES (no GPU needed)."""

    def properties(device=None):
        sm, threads = FAKE_DEVICES[_index(device)]
        return types.SimpleNamespace(
            name=f"fake cuda:{_index(device)}",
            multi_processor_count=sm,
            max_threads_per_multi_processor=threads,
        )

    if torch.cuda.is_available():  # a real GPU host: CUDA's own init reads the real properties
        torch.cuda.init()
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return FAKE_DEVICES
