"""RecordingMode: the dispatch mode active while ``deferred_init`` runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from torchdefer.fake.tensor import reported_device
from torchdefer.recorder.graph import Graph

__all__ = ["RecordingMode", "recording", "suspended"]

_FAKE = torch._C._TorchDispatchModeKey.FAKE


class RecordingMode(TorchDispatchMode):
    """Records every op, factory calls included, into ``graph``.

    Like ``FakeTensorMode`` it takes PyTorch's FAKE mode slot, which is what
    lets ``device="cuda"`` pass CUDA's lazy initialization on hosts without it.
    """

    def __init__(self, graph: Graph) -> None:
        super().__init__()
        self._mode_key = _FAKE
        self.graph = graph

    def __enter__(self) -> RecordingMode:
        # As under FakeTensorMode: torch.tensor(data, device="cuda") lifts a CPU
        # tensor and moves it with a dispatched .to(), which we record, instead
        # of copying to a device this host may not have.
        self._lift_cpu_only = torch._C._only_lift_cpu_tensors()
        torch._C._set_only_lift_cpu_tensors(True)
        try:
            return super().__enter__()
        except BaseException:
            torch._C._set_only_lift_cpu_tensors(self._lift_cpu_only)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            torch._C._set_only_lift_cpu_tensors(self._lift_cpu_only)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        if func is torch.ops.prim.device.default:
            return reported_device(args[0])
        from torchdefer.recorder.record import record_call

        return record_call(self.graph, func, args, kwargs or {})


@contextlib.contextmanager
def recording(graph: Graph) -> Iterator[None]:
    """Record into ``graph`` unless a recording is already active."""
    if isinstance(torch._C._get_dispatch_mode(_FAKE), RecordingMode):
        yield
        return
    with RecordingMode(graph):
        yield


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Run real code while a recording is active (replay, constants, data reads).

    ``torch.utils._python_dispatch._disable_current_modes`` leaves the FAKE
    slot alone, so the recording mode is taken out and put back here.
    """
    mode = torch._C._unset_dispatch_mode(_FAKE)
    try:
        with _disable_current_modes():
            yield
    finally:
        if mode is not None:
            torch._C._set_dispatch_mode(mode)
