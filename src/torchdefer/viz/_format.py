"""Short, stable text for shapes, dtypes, ops, arguments and source lines."""

from __future__ import annotations

import os
from typing import Any

import torch

from torchdefer.errors import InternalError
from torchdefer.recorder._graph import Node, NodeKind, SourceLocation, TensorMeta, Value

__all__ = [
    "DASH",
    "TIMES",
    "fmt_args",
    "fmt_bytes",
    "fmt_dtype",
    "fmt_meta",
    "fmt_shape",
    "fmt_source",
    "node_title",
    "op_name",
    "rng_text",
    "short_repr",
]

TIMES = "\u00d7"  # the multiplication sign of 8192x28672 (ruff flags it written out)
DASH = "\u2013"  # the en dash of layers.0-79

# Arguments already visible in the output's shape/dtype/device, or noise.
_HIDDEN_ARGS = frozenset(
    {"dtype", "layout", "device", "pin_memory", "memory_format", "requires_grad",
     "generator", "non_blocking", "out"}
)
_MAX_ARGS = 48  # characters of argument text kept on a line


def fmt_shape(size: tuple[int, ...]) -> str:
    """``(8192, 28672)`` -> ``8192x28672`` (with a multiplication sign); a scalar is ``scalar``."""
    return TIMES.join(str(s) for s in size) if size else "scalar"


def fmt_dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def fmt_meta(meta: TensorMeta) -> str:
    return f"{fmt_shape(meta.size)} {fmt_dtype(meta.dtype)} {meta.device}"


def fmt_bytes(n: int) -> str:
    """Bytes in binary units, e.g. ``131.4 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise InternalError("a size beyond every unit (please report)")  # pragma: no cover


def fmt_source(source: SourceLocation | None) -> str | None:
    """``file:line`` with the file shortened: from the package root inside
    ``site-packages``, else relative to the working directory."""
    if source is None:
        return None
    return f"{_short_path(source.file)}:{source.line}"


def _short_path(file: str) -> str:
    marker = "site-packages" + os.sep
    cut = file.rfind(marker)
    if cut >= 0:
        return file[cut + len(marker):]
    cwd = os.getcwd() + os.sep
    if file.startswith(cwd):
        return file[len(cwd):]
    return file


def op_name(node: Node) -> str:
    """The op without namespace and overload (``aten.uniform_.default`` -> ``uniform_``)."""
    if node.op is None:
        return node.kind.value
    packet = getattr(node.op, "overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(node.op, "__name__", str(node.op))


def fmt_args(node: Node) -> str:
    """The op's non-default arguments, tensors as ``%seq``, cut to one short line."""
    if node.spec is None or node.op is None:
        return ""
    args, kwargs = node.arguments()
    schema = getattr(node.op, "_schema", None)
    parts: list[str] = []
    names = [a.name for a in schema.arguments] if schema is not None else []
    for i, arg in enumerate(args):
        name = names[i] if i < len(names) else None
        _add_arg(parts, name, arg, schema, i)
    for name, arg in kwargs.items():
        index = names.index(name) if name in names else None
        _add_arg(parts, name, arg, schema, index)
    text = ", ".join(parts)
    return text if len(text) <= _MAX_ARGS else text[: _MAX_ARGS - 1] + "…"


def _add_arg(parts: list[str], name: str | None, arg: Any, schema: Any, index: int | None):
    if name in _HIDDEN_ARGS or arg is None:
        return
    if isinstance(arg, Value):
        parts.append(f"%{arg.node.seq}")
        return
    if isinstance(arg, (list, tuple)) and any(isinstance(a, Value) for a in arg):
        parts.append("[" + ", ".join(_leaf(a) for a in arg) + "]")
        return
    if schema is not None and index is not None and index < len(schema.arguments):
        declared = schema.arguments[index]
        if declared.has_default_value() and _same(declared.default_value, arg):
            return
    shown = _leaf(arg)
    parts.append(shown if name is None or index == 0 else f"{name}={shown}")


def _leaf(arg: Any) -> str:
    if isinstance(arg, Value):
        return f"%{arg.node.seq}"
    if isinstance(arg, float):
        return f"{arg:.6g}"
    if isinstance(arg, (list, tuple)):
        return "[" + ", ".join(_leaf(a) for a in arg) + "]"
    return str(arg)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # exotic defaults (tensors, devices) that do not compare
        return False


def rng_text(node: Node) -> str | None:
    """``generator default cpu, draw 28`` (and the epoch when it was reseeded);
    a user's generator is named by its stream number and seed."""
    if node.rng is None:
        return None
    stream, epoch, position = node.rng.stream, node.rng.epoch, node.rng.index
    if stream.generator is None:
        who = f"default {stream.device}"
    else:
        # The id of the Python wrapper means nothing to a reader; the stream's
        # number in the recording and the generator's seed do.
        streams = list(node.graph.rng.streams.values()) if node.graph is not None else []
        number = next((i for i, s in enumerate(streams) if s is stream), 0)
        who = f"#{number} (initial seed {stream.generator.initial_seed()}) on {stream.device}"
    epoch_text = f", after reseed {epoch}" if epoch else ""
    return f"generator {who}, draw {position}{epoch_text}"


def node_title(node: Node) -> str:
    """What a node did, in a few words: ``uniform_(%97, from=-0.1, to=0.1)``."""
    kind = node.kind
    if kind == NodeKind.CONSTANT:
        return "constant (captured by value)"
    if kind == NodeKind.EXTERNAL:
        return "external real tensor"
    if kind == NodeKind.DATA_SET:
        return f".data = %{node.inputs[0].node.seq}"
    if kind == NodeKind.DATA_GET:
        return f".data of %{node.inputs[0].node.seq}"
    if kind == NodeKind.OBSERVE:
        name = getattr(node.op, "__name__", "read")
        return f"{name}(%{node.inputs[0].node.seq}) = {short_repr(node.payload)}"
    return f"{op_name(node)}({fmt_args(node)})"


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to 24 characters."""
    text = repr(value)
    return text if len(text) <= 24 else text[:23] + "…"
