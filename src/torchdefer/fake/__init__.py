"""Fake tensors: a real device reported, a meta tensor inside, no storage."""

from torchdefer.fake._meta import meta_like
from torchdefer.fake._mode import FakeMode, fake_mode
from torchdefer.fake._output_device import device_available, output_device
from torchdefer.fake._tensor import FakeTensor, FakeTensorError, is_fake, run_on_meta

__all__ = [
    "FakeMode",
    "FakeTensor",
    "FakeTensorError",
    "device_available",
    "fake_mode",
    "is_fake",
    "meta_like",
    "output_device",
    "run_on_meta",
]
