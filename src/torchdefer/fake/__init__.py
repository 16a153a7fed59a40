"""Fake tensors: a real device reported, a meta tensor inside, no storage."""

from torchdefer.fake.device import device_available, output_device
from torchdefer.fake.meta import meta_like
from torchdefer.fake.mode import FakeMode, fake_mode
from torchdefer.fake.tensor import FakeTensor, FakeTensorError, is_fake, run_on_meta

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
