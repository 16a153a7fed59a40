"""The one call the recorder makes into materialization, injected from above.

Data-dependent reads during recording (``.item()``, ``.tolist()``) need a real
value, which only ``torchdefer.materialize`` can compute; the recorder must not
import it (dependencies point one way). ``torchdefer.materialize`` installs its
reader here when imported, and ``import torchdefer`` always imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdefer.errors import StateError

__all__ = ["read_value", "set_value_reader"]

_reader: list[Callable[[Any], Any]] = []


def set_value_reader(reader: Callable[[Any], Any]) -> None:
    _reader[:] = [reader]


def read_value(tensor: Any) -> Any:
    if not _reader:
        raise StateError(
            "Reading a deferred tensor's value needs torchdefer.materialize; "
            "import torchdefer (not only torchdefer.recorder)."
        )
    return _reader[0](tensor)
