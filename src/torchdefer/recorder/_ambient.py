"""Global settings that change what an op computes, captured per node and re-applied.

An op's result can depend on process-wide settings read when it runs, not
only on its arguments:

* ``torch.get_default_dtype()``: integers promoted to a float (``log(arange(4))``,
  ``arange(4) * 0.5``, int / int, ``sqrt``/``pow`` of ints) take it; Hugging
  Face's ``from_config(..., dtype=torch.bfloat16)`` sets it while building;
* deterministic algorithms: ``torch.empty`` is filled with NaN, and some
  kernels sum in another order, while ``torch.use_deterministic_algorithms(True)``
  is on;
* ``torch.set_float32_matmul_precision``: below "highest", float32 matmuls may
  run in TF32 or bfloat16;
* inference mode: a tensor created under ``torch.inference_mode()`` is an
  inference tensor (eager's parameters of a model built there are), and one
  created outside is not, whatever mode ``materialize_module`` is called in.

Not captured (no getter in torch): ``torch.set_flush_denormal``.

Each recorded node keeps the :class:`Ambient` active when it was recorded
(interned: nodes share one object per distinct setting), and replay runs each
node under it, switching only when it changes and restoring the caller's
settings at the end. Factory ops additionally get their ``dtype`` written into
the call (``recorder._record``), which keeps the graph readable.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType

import torch

from torchdefer import _compat

__all__ = ["Ambient", "AmbientSwitch", "current_ambient", "in_inference_mode"]


@dataclass(frozen=True, slots=True)
class Ambient:
    default_dtype: torch.dtype
    deterministic: bool
    warn_only: bool
    fill_uninitialized_memory: bool
    float32_matmul_precision: str
    inference: bool


_interned: dict[tuple, Ambient] = {}


_dtype, _deterministic, _warn_only, _fill, _precision, _inference = _compat.AMBIENT_GETTERS


def current_ambient() -> Ambient:
    """The settings active now (the same object for the same settings)."""
    # Read for every recorded op: the C getters, bound once (see _compat).
    key = (_dtype(), _deterministic(), _warn_only(), _fill(), _precision(), _inference())
    ambient = _interned.get(key)
    if ambient is None:
        ambient = _interned[key] = Ambient(*key)
    return ambient


def in_inference_mode(ambient: Ambient) -> Ambient:
    """``ambient`` with inference mode on (interned like :func:`current_ambient`'s).

    For an op that writes an inference tensor outside inference mode: eager's
    kernel writes (and draws), then autograd refuses the write; replayed in
    inference mode, the write happens and nothing refuses it.
    """
    key = (*(getattr(ambient, f) for f in Ambient.__slots__[:-1]), True)
    out = _interned.get(key)
    if out is None:
        out = _interned[key] = Ambient(*key)
    return out


def _apply(ambient: Ambient) -> None:
    torch.set_default_dtype(ambient.default_dtype)
    torch.use_deterministic_algorithms(ambient.deterministic, warn_only=ambient.warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = ambient.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.set_float32_matmul_precision(ambient.float32_matmul_precision)


class AmbientSwitch:
    """Applies each node's :class:`Ambient` in turn; restores the caller's on exit.

    >>> import torch
    >>> _ = torch.set_default_dtype(torch.float64); recorded = current_ambient()
    >>> _ = torch.set_default_dtype(torch.float32)
    >>> with AmbientSwitch() as switch:
    ...     switch.use(recorded)  # before running a node recorded under float64
    ...     torch.get_default_dtype()
    torch.float64
    >>> torch.get_default_dtype()
    torch.float32
    """

    def __init__(self) -> None:
        self._saved = current_ambient()
        self._now = self._saved
        # Inference mode is a guard, not a setting: at most one is held, entered
        # from the caller's mode, and left before the next one is entered.
        self._inference: torch.inference_mode | None = None

    def __enter__(self) -> AmbientSwitch:
        return self

    def use(self, ambient: Ambient | None) -> None:
        if ambient is not None and ambient is not self._now:
            _apply(ambient)
            if ambient.inference != self._now.inference:
                self._leave_inference()
                if ambient.inference != self._saved.inference:
                    self._inference = torch.inference_mode(ambient.inference)
                    self._inference.__enter__()
            self._now = ambient

    def _leave_inference(self) -> None:
        if self._inference is not None:
            guard, self._inference = self._inference, None
            guard.__exit__(None, None, None)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._now is not self._saved:
            self._leave_inference()
            _apply(self._saved)
            self._now = self._saved
