"""Errors raised by descriptor checks, scripting and program files."""

from __future__ import annotations

from collections.abc import Sequence

from torchdefer.errors import TorchdeferError

__all__ = ["DescriptorConflict", "DescriptorMismatch", "MissingGraph", "ProgramFileError"]

# Properties read as ``x.dtype``; the others (``value``, ``type``, ``structure``)
# are written ``x (value)``.
_TENSOR_ATTRIBUTES = frozenset({"ndim", "dtype", "device", "layout", "requires_grad"})


class DescriptorMismatch(TorchdeferError, TypeError):
    """An argument does not satisfy the input descriptor a program was scripted for.

    For a symbolic dimension the message also says where the name was bound
    (``'b' is 7 from x.shape[1]``).

    Attributes:
        path: where in the call the offending value sits, e.g. ``inp['b'][1]``.
        property: the checked property, e.g. ``shape[0]``, ``dtype``, ``value``.
        expected: the descriptor's requirement, as text.
        got: what the call passed, as text.

    Example:
        >>> import torch, torchdefer
        >>> from torchdefer import DescriptorMismatch, MetaTensorType
        >>> p = torchdefer.script(lambda x: x + 1, {"x": MetaTensorType(["b", 4], torch.float32)})
        >>> try:
        ...     p(torch.zeros(2, 5))
        ... except DescriptorMismatch as e:
        ...     print(e.path, e.property, e.expected, e.got)
        x shape[1] 4 5
    """

    def __init__(self, path: str, property: str, expected: str, got: str, detail: str = "") -> None:
        self.path, self.property, self.expected, self.got = path, property, expected, got
        self.detail = detail
        tensor_attribute = property.startswith("shape[") or property in _TENSOR_ATTRIBUTES
        where = f"{path}.{property}" if tensor_attribute else f"{path} ({property})"
        super().__init__(f"{where}: expected {expected}, got {got}{detail and '; ' + detail}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str, str]]:
        return (type(self), (self.path, self.property, self.expected, self.got, self.detail))


class DescriptorConflict(TorchdeferError, ValueError):
    """The model's code contradicts its input descriptors (found at ``script()`` time).

    E.g. a dimension described as symbolic (``"b"``) that the code forces to
    one value (``x.view(4, -1)``); the message names the dimension, the
    condition in the descriptors' names and the user's line that imposed it.

    Attributes:
        dims: the descriptor names (``"b"``, or ``"x.shape[1]"`` for a ``None``
            dim) the code constrained; empty when tracing failed otherwise.
    """

    def __init__(self, message: str, dims: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.dims = tuple(dims)

    def __reduce__(self) -> tuple[type, tuple[str, tuple[str, ...]]]:
        return (type(self), (str(self), self.dims))


class ProgramFileError(TorchdeferError, ValueError):
    """A program file is damaged, not a torchdefer program, or holds something
    that loading would have to execute; the message names the file and the part."""


class MissingGraph(TorchdeferError, RuntimeError):
    """An export program has no graph for a call, and cannot build one: it was
    loaded from a file (which cannot trace the model), or is being saved
    before any graph was built (the file could run nothing).

    The message says which case is missing and how to have it built: call
    the scripted program with such inputs before ``save_program()``, or list the
    dtypes with ``script(..., dtypes=[...])``.
    """
