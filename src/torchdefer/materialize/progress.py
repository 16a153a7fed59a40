"""Progress of long materializations: a tqdm bar for people, a callback for frameworks.

Materializing a 1B-parameter model takes tens of seconds; loading a checkpoint
into it as long. Each entry point that does such work takes ``progress=``:

* ``None`` (default): a bar on stderr when stderr is a terminal, shown only
  once the work has taken more than two seconds (short calls stay silent);
* ``True`` / ``False``: always / never show the bar;
* a callable: called with a :class:`ProgressEvent` after each tensor, and no
  bar (frameworks draw their own).

What this module deliberately does not do: estimate the work of a tensor from
its recorded ops. Bytes of the results are the unit; they track time well for
initialization, where filling memory dominates.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchdefer.errors import UsageTypeError

__all__ = ["Progress", "ProgressEvent", "ProgressSpec"]


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """Where a materialization or checkpoint load stands, after one more tensor.

    ``name`` is the tensor just finished (``model.layers.3.mlp.up_proj.weight``);
    ``done``/``total`` count tensors, ``done_bytes``/``total_bytes`` their bytes
    once real; ``task`` says what is running (``"materialize"``, ``"load"``).
    """

    task: str
    name: str
    done: int
    total: int
    done_bytes: int
    total_bytes: int


ProgressSpec = bool | Callable[[ProgressEvent], Any] | None

# A bar appears only after this many seconds, so short calls print nothing.
_AUTO_DELAY_S = 2.0


class Progress:
    """Counts finished tensors and reports them as ``spec`` asks (see the module doc).

    Use as a context manager so the bar is closed also when materialization
    raises::

        with Progress("materialize", total, total_bytes, progress) as bar:
            for name, tensor in work:
                ...
                bar.advance(name, nbytes)
    """

    def __init__(self, task: str, total: int, total_bytes: int, spec: ProgressSpec) -> None:
        if not (spec is None or isinstance(spec, bool) or callable(spec)):
            raise UsageTypeError(
                f"progress= must be None (a bar on a terminal), True, False or a callable "
                f"taking a torchdefer ProgressEvent; got {type(spec).__name__} {spec!r}."
            )
        self.task = task
        self.total = total
        self.total_bytes = total_bytes
        self.done = 0
        self.done_bytes = 0
        self._callback = spec if callable(spec) and not isinstance(spec, bool) else None
        self._bar: Any = None
        if self._callback is None and spec is not False and total > 0:
            if spec is True or _stderr_is_terminal():
                self._bar = _tqdm_bar(task, total_bytes, delay=0.0 if spec else _AUTO_DELAY_S)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, name: str, nbytes: int) -> None:
        """One more tensor (``name``, ``nbytes`` once real) is done."""
        self.done += 1
        self.done_bytes += nbytes
        if self._bar is not None:
            self._bar.set_postfix_str(name, refresh=False)
            self._bar.update(nbytes)
        if self._callback is not None:
            self._callback(ProgressEvent(self.task, name, self.done, self.total,
                                         self.done_bytes, self.total_bytes))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _stderr_is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def _tqdm_bar(task: str, total_bytes: int, delay: float) -> Any:
    from tqdm import tqdm

    return tqdm(total=total_bytes, desc=task, unit="B", unit_scale=True, unit_divisor=1024,
                delay=delay, file=sys.stderr, dynamic_ncols=True, leave=False)
