"""FakeMode: a dispatch mode that turns factory calls into fake tensors."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from torchdefer import _compat
from torchdefer.fake._layout import meta_twin
from torchdefer.fake._output_device import device_available, normalize, output_device
from torchdefer.fake._outside import no_fake_modes
from torchdefer.fake._pinned import lifted_is_pinned, refuse_in_fake_mode
from torchdefer.fake._tensor import (
    FakeTensor,
    FakeTensorError,
    flat_tensors,
    reported_device,
    run_on_meta,
    wrap_outputs,
)

_DATA_TAGS = frozenset({torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output})
_TO = torch.ops.aten.to
_LIFT = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)

__all__ = [
    "FakeMode",
    "FakeSlotMode",
    "check_device",
    "fake_mode",
    "faking",
    "no_fake_modes",
    "to_meta",
]


class FakeSlotMode(TorchDispatchMode):
    """A dispatch mode in PyTorch's FAKE slot, as ``FakeTensorMode`` uses.

    Only a mode in that slot lets ``torch.empty(..., device="cuda")`` pass
    CUDA's lazy initialization on a host without CUDA. While active, like
    under ``FakeTensorMode``, ``torch.tensor(data, device="cuda")`` lifts a CPU
    tensor and moves it with a dispatched ``.to()`` instead of copying to a
    device this host may not have.
    """

    def __init__(self) -> None:
        super().__init__()
        self._mode_key = _compat.FAKE_MODE_KEY
        self._lift_cpu_only = False

    def __enter__(self) -> FakeSlotMode:
        import_dynamo_outside_modes()
        self._lift_cpu_only = _compat.only_lift_cpu_tensors()
        _compat.set_only_lift_cpu_tensors(True)
        try:
            return super().__enter__()
        except BaseException:
            _compat.set_only_lift_cpu_tensors(self._lift_cpu_only)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            _compat.set_only_lift_cpu_tensors(self._lift_cpu_only)


class FakeMode(FakeSlotMode):
    """Turns every tensor created while active into a :class:`FakeTensor`."""

    def __init__(self, *, fake_cuda: bool = True) -> None:
        super().__init__()
        self.fake_cuda = fake_cuda

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.prim.device.default:
            return reported_device(args[0])
        if func.overloadpacket is _TO:
            # Reaches dispatch undecomposed only for inference tensors (no
            # autograd key), its device maybe positional: decomposed as eager does.
            return func.decompose(*args, **kwargs)
        decomposed = _compat.decomposed_in_inference(func, args, kwargs)  # reshape, ...
        if decomposed is not None:
            return decomposed
        if func in _LIFT and lifted_is_pinned(args[0]):
            refuse_in_fake_mode(func, torch.device("cpu"))
        args, kwargs = tree_map(to_meta, (args, kwargs))
        if "device" in kwargs and kwargs["device"] is not None:
            check_device(torch.device(kwargs["device"]), self.fake_cuda, func)
        if kwargs.get("pin_memory"):  # fake._pinned: never an unpinned fake silently
            refuse_in_fake_mode(func, output_device(kwargs, flat_tensors(args, kwargs)))
        try:
            out, device = run_on_meta(func, args, kwargs)
        except (NotImplementedError, RuntimeError) as error:
            if _DATA_TAGS.isdisjoint(func.tags):
                raise
            raise FakeTensorError(
                f"{func} needs the data of its inputs (its result's shape or value depends "
                "on them), and fake tensors have none. Use torchdefer.deferred_init, which "
                "computes it from the recorded values, or call it on real tensors."
            ) from error
        return wrap_outputs(out, device, FakeTensor)


def to_meta(x: Any) -> Any:
    """A real tensor becomes a fake one of the same shape; anything else stays."""
    if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor):
        return FakeTensor(meta_twin(x), x.device)
    return x


def check_device(device: torch.device, fake_cuda: bool, func: Any) -> None:
    """Refuse a device this host lacks unless faking it was asked for."""
    if fake_cuda or device.type in ("meta", "cpu") or device_available(normalize(device)):
        return
    raise FakeTensorError(
        f"{func} asked for device '{device}', which this process does not have, and "
        "fake_cuda=False. Pass fake_cuda=True to create fake tensors on it anyway."
    )


@contextlib.contextmanager
def fake_mode(*, fake_cuda: bool = True) -> Iterator[FakeMode]:
    """Create fake tensors (real device reported, no storage), recording nothing.

    Args:
        fake_cuda: allow ``cuda`` devices on a host without CUDA. The default
            is ``True``, where torchdistX's ``fake_mode(*, fake_cuda=False)``
            refused them; pass ``fake_cuda=False`` for torchdistX's behaviour.

    >>> import torch, torchdefer
    >>> with torchdefer.fake_mode():
    ...     w = torch.randn(4096, 4096, device="cuda")
    >>> w.is_cuda, torchdefer.is_fake(w)
    (True, True)
    """
    mode = FakeMode(fake_cuda=fake_cuda)
    with mode:
        yield mode


@contextlib.contextmanager
def faking() -> Iterator[None]:
    """Keep a fake mode active for calls on fake tensors made outside ``fake_mode``.

    Factory calls such a call makes (``t.new_tensor(...)`` on a fake CUDA
    tensor) must give fake tensors, and only a mode in PyTorch's FAKE slot
    lets them pass CUDA's lazy initialization on a host without it.
    """
    if _compat.get_dispatch_mode(_compat.FAKE_MODE_KEY) is not None:
        yield
        return
    with FakeMode(fake_cuda=True):
        yield


def import_dynamo_outside_modes() -> None:
    """Import ``torch._dynamo`` now, with no fake or recording mode active.

    PyTorch imports it lazily, from the first meta kernel that asks for it
    (``_disable_dynamo``); under one of our modes the import's own torch calls
    would come back to us half imported (torch 2.8: a circular import). It
    also replaces ``torch.Tensor._make_subclass`` when imported, which
    ``recorder._subclasses`` must see first.
    """
    if "torch._dynamo" not in sys.modules:
        with no_fake_modes():
            _compat.import_dynamo()
