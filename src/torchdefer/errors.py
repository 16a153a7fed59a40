"""Every error torchdefer raises, in one hierarchy under :class:`TorchdeferError`.

``except torchdefer.TorchdeferError`` catches them all. Each error also keeps
the built-in type it always had (``RecordingError`` and ``ReplayError`` are
``RuntimeError``\\ s, ``DescriptorMismatch`` is a ``TypeError``,
``CheckpointKeyError`` a ``KeyError``), so existing ``except RuntimeError``
blocks still work. A failure replay adds context to (an out-of-memory error, a
``ValueError`` from an op) keeps its own type as well: see
:func:`torchdefer.materialize._error_context.with_context`.

The tree (built-in bases in brackets)::

    TorchdeferError
    ├── UsageError [ValueError]             an argument's value cannot be honoured
    │   ├── ThreadsError, UnsafeExpression, ForbiddenOperator
    ├── UsageTypeError [TypeError]          an argument of the wrong kind
    ├── LookupKeyError [KeyError], LookupAttributeError [AttributeError]
    ├── StateError [RuntimeError]           the object is not in a state that allows it
    ├── UnsupportedError [RuntimeError]     this torch / interpreter lacks what is needed
    ├── MissingDependencyError [ImportError]
    ├── InternalError [RuntimeError]        a torchdefer bug: please report it
    ├── FakeTensorError, PinnedMemoryError [RuntimeError]
    ├── RecordingError [RuntimeError] ── EagerRefusalError (also eager's own type)
    ├── ReplayError [RuntimeError]
    │   ├── DeviceUnavailableError, ExternalTensorModifiedError, UntaggedRandomOpError
    ├── SwapError [RuntimeError]
    ├── CheckpointError                     one subclass per built-in kind (below)
    ├── DescriptorMismatch [TypeError], DescriptorConflict, ProgramFileError [ValueError]
    ├── MissingGraph [RuntimeError]
    └── GraphvizNotFoundError [RuntimeError]

The packages' ``errors`` modules (``torchdefer.materialize._error_context``, ...)
re-export their classes from here, so the older import paths keep working.
This module imports nothing from torchdefer, so every layer (``fake`` first)
can derive from it.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence

__all__ = [
    "CheckpointDeviceError",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointFormatError",
    "CheckpointKeyError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointRankError",
    "CheckpointUsageError",
    "CheckpointWriteError",
    "DescriptorConflict",
    "DescriptorMismatch",
    "DeviceUnavailableError",
    "EagerRefusalError",
    "ExternalTensorModifiedError",
    "FakeTensorError",
    "ForbiddenOperator",
    "GraphvizNotFoundError",
    "InternalError",
    "LookupAttributeError",
    "LookupKeyError",
    "MissingDependencyError",
    "MissingGraph",
    "PinnedMemoryError",
    "ProgramFileError",
    "RecordingError",
    "ReplayError",
    "StateError",
    "SwapError",
    "ThreadsError",
    "TorchdeferError",
    "UnsafeCheckpointError",
    "UnsafeExpression",
    "UnsupportedError",
    "UntaggedRandomOpError",
    "UsageError",
    "UsageTypeError",
]


class TorchdeferError(Exception):
    """Base class of torchdefer's errors; the message says what, where and what to do.

    >>> import torch, torchdefer
    >>> try:
    ...     torchdefer.deferred_init(torch.empty, 2, layout=torch.sparse_coo)
    ... except torchdefer.TorchdeferError as e:
    ...     print(type(e).__name__, isinstance(e, RuntimeError))
    RecordingError True
    """


def _message_only(self: BaseException) -> str:
    # KeyError's str() would quote the whole message.
    return str(self.args[0]) if self.args else ""


# --- What any part of torchdefer may raise -----------------------------------


class UsageError(TorchdeferError, ValueError):
    """An argument's value torchdefer cannot honour (a range, a name, a mode).

    >>> import torchdefer
    >>> from torchdefer.descriptors import MetaTensorType
    >>> try:
    ...     MetaTensorType([-1])
    ... except torchdefer.errors.UsageError as e:
    ...     print(isinstance(e, ValueError), str(e).split(";")[0])
    True MetaTensorType: shape[0] is -1
    """


class UsageTypeError(TorchdeferError, TypeError):
    """An argument of a kind the call does not take (a function where a module
    belongs, a tensor where a descriptor belongs, ...)."""


class LookupKeyError(TorchdeferError, KeyError):
    """A name or key that is not there; the message lists those that are."""

    __str__ = _message_only


class LookupAttributeError(TorchdeferError, AttributeError):
    """An attribute that is not there; the message lists those that are."""


class StateError(TorchdeferError, RuntimeError):
    """The call is well formed but the object is not in a state that allows it
    (a program built in train mode called in eval mode, weights not bound)."""


class UnsupportedError(TorchdeferError, RuntimeError):
    """This PyTorch build or Python interpreter lacks something the call relies on
    (a private hook, a memory layout); the message says what to use instead."""


class MissingDependencyError(TorchdeferError, ImportError):
    """An optional package (or part of PyTorch) the call needs is not installed;
    the message says what to install."""


class InternalError(TorchdeferError, RuntimeError):
    """torchdefer broke one of its own invariants: a bug in torchdefer, never in
    your code. The message says what was expected; please report it."""


# --- Fake tensors (torchdefer.fake) ------------------------------------------


class FakeTensorError(TorchdeferError, RuntimeError):
    """A fake tensor was asked for something it does not have (its data), or for
    a device this process does not have without ``fake_cuda=True``."""


class PinnedMemoryError(TorchdeferError, RuntimeError):
    """A pinning call eager PyTorch refuses (no accelerator, a tensor off the CPU), or
    one a fake tensor without a recording cannot carry. A ``RuntimeError``, as eager's."""


# --- Recording (torchdefer.recorder) -----------------------------------------


class RecordingError(TorchdeferError, RuntimeError):
    """An op could not be recorded faithfully; the message says why and what to do."""


class EagerRefusalError(RecordingError):
    """Eager PyTorch raises on this call; so does recording, at the call.

    Raised as a class that is also the original error's type
    (``NotImplementedError`` for a dtype a kernel lacks), so code that
    catches what eager raises still catches it.
    """


# --- Replay (torchdefer.materialize) -----------------------------------------


class ReplayError(TorchdeferError, RuntimeError):
    """Replaying a recorded op failed; the message names the op and where it was recorded.

    An error raised by the op itself keeps its type: it is re-raised as an
    instance of both :class:`ReplayError` and the original class (see
    :func:`torchdefer.materialize._error_context.with_context`), so
    ``except torch.OutOfMemoryError`` or ``except ValueError`` still catch it.
    """


class DeviceUnavailableError(ReplayError):
    """A tensor was recorded on a device this process does not have."""


class ExternalTensorModifiedError(ReplayError):
    """A real tensor used during recording was changed before materialization."""


class UntaggedRandomOpError(ReplayError):
    """An op recorded as deterministic drew random numbers when replayed."""


class SwapError(TorchdeferError, RuntimeError):
    """A real tensor could not take the place of a deferred one in a module."""


class ThreadsError(UsageError):
    """``threads=`` of a materialization is not a positive int or None (a ValueError)."""


# --- Checkpoints (torchdefer.checkpoint) -------------------------------------
# Every message names the file (and the member or key), says what is wrong and
# what to do. A load that raises one of these changed nothing in the model; a
# save that raises one leaves nothing at the path it was given.


class CheckpointError(TorchdeferError):
    """Base class of the errors :func:`torchdefer.load_state_dict` and the
    checkpoint writers raise."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The path, a shard the index names, or a DCP data file does not exist."""


class CheckpointFormatError(CheckpointError, ValueError):
    """A file is damaged or not in the format its name or contents claim."""


class UnsafeCheckpointError(CheckpointError, pickle.UnpicklingError):
    """A file asks to run code (a pickle global outside the allowlist) or to read
    outside its directory; refused before anything ran."""


class CheckpointKeyError(CheckpointError, KeyError):
    """``strict=True`` and keys are missing or unexpected, or nothing matches at all."""

    __str__ = _message_only


class CheckpointMismatchError(CheckpointError, ValueError):
    """The checkpoint does not fit the module: a shape, a tie, a non-tensor entry."""


class CheckpointDeviceError(CheckpointError, RuntimeError):
    """A tensor's device is not available in this process."""


class CheckpointUsageError(CheckpointError, TypeError):
    """The arguments cannot be honoured for this module or source."""


class CheckpointRankError(CheckpointError, RuntimeError):
    """A sharded load failed on another rank; this rank refused it too, unchanged."""


class CheckpointExistsError(CheckpointError, FileExistsError):
    """The destination is a file or a non-empty directory; nothing is overwritten."""


class CheckpointWriteError(CheckpointError, ValueError):
    """The model or the arguments cannot be written as asked (format, dtype, shard
    size, tensors safetensors cannot hold, ties the format cannot express)."""


# --- Descriptors and program files (torchdefer.descriptors) ------------------

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


class UnsafeExpression(UsageError):
    """A text is not a plain shape expression; it is refused, never evaluated.
    Reading a program file turns it into a :class:`ProgramFileError` naming the file."""


class ForbiddenOperator(UsageError):
    """A graph calls something other than tensor math. Reading a program file turns
    it into a :class:`ProgramFileError`; ``save_program()`` into a ``UsageTypeError``."""


# --- Pictures (torchdefer.viz) -----------------------------------------------


class GraphvizNotFoundError(TorchdeferError, RuntimeError):
    """Rendering a picture needs Graphviz's ``dot`` program, which was not found."""
