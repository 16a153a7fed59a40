"""The operators a graph read from a program file may call: tensor math only.

torch's own checks on a deserialized ``torch.export`` graph stop at "every
node calls an operator"; ``aten.from_file(path, shared=True)`` followed by
``fill_`` is such a graph, and it creates or overwrites a file when the
loaded program is called (``torch.export.load`` has that hole). A graph read
from a file is therefore checked against an allowlist, twice: on the decoded
JSON, before torch resolves any name in it, and on the built graph module
(every subgraph included), before it can run.

A node may call:

* an ``aten`` operator registered with the dispatcher (TorchScript-only
  builtins such as ``aten::save`` or ``aten::manual_seed`` are not), except
  the few that reach outside the tensors they are given (``_DENIED``: files,
  pinned host memory and streams, standard output, process-wide caches, a
  tensor bound to a storage from outside the graph; views (``_reshape_alias``)
  and sparse constructors whose layout torch does not check, and backward
  kernels, which trust the indices their forward produced: with these a
  graph reads and writes outside its memory) and PyTorch's own ``_test_``
  operators; ``pin_memory=True`` is refused on any operator.
  ``_local_scalar_dense`` (``.item()``) stays allowed: it reads one value of a
  tensor the graph holds into a number, which is how data-dependent sizes are
  checked; random operators draw from the process's default generator, as the
  eager module would;
* symbolic size arithmetic (the fixed table torch's serializer writes:
  ``_operator.add``, ``torch.sym_max`` ...);
* a higher-order operator whose only callees are subgraphs stored in the
  same file (``cond``, ``while_loop`` ... : ``_HIGHER_ORDER``), those
  subgraphs checked by the same rule.

Everything else is refused: other namespaces (custom ops, collectives that
reach the network, ``prims``), higher-order operators that run code from
elsewhere (Triton kernels, torchbind objects, effects), torchbind object
arguments. What this deliberately does not promise: that an allowed kernel
is free of bugs, or that ``empty`` hands back zeroed memory.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterator
from typing import Any

import torch

from torchdefer._compat.export import HigherOrderOperator, OpOverload, dispatcher_operator_names
from torchdefer.errors import ForbiddenOperator
from torchdefer.fake._source import is_library_file

__all__ = ["ForbiddenOperator", "check_graph_json", "check_graph_module", "refusal_for_aten"]

_BACKWARD = ("is a backward kernel, which trusts the indices and sizes its forward produced; "
             "a program file holds forward graphs")
_UNCHECKED_SPARSE = "builds a sparse tensor whose indices torch does not check against its size"
_DENIED: dict[str, str] = {
    "from_file": "reads and writes files (shared=True maps the file into memory)",
    **dict.fromkeys(("_pin_memory", "pin_memory"), "pins host memory of the process"),
    "is_pinned": "inspects the host memory allocator of the process",
    "record_stream": "hands memory to a device stream of the process",
    "_print": "writes to the process's standard output",
    **dict.fromkeys(("_cufft_clear_plan_cache", "_cufft_set_plan_cache_max_size",
                     "_cufft_get_plan_cache_max_size", "_cufft_get_plan_cache_size"),
                    "reads or changes the process's cuFFT plan cache"),
    # Memory: views and sparse tensors whose layout torch takes on trust. A crafted
    # graph reads and writes outside its storage with them (a segfault, or worse).
    **dict.fromkeys(("_reshape_alias", "_reshape_alias_copy"),
                    "makes a view with strides torch does not check against its storage"),
    "_coalesced_": _UNCHECKED_SPARSE,
}
_STORAGE = "binds a tensor to a storage from outside the graph"
_HIGHER_ORDER = frozenset(("cond", "while_loop", "map_impl", "scan", "invoke_subgraph",
                           "wrap_with_set_grad_enabled", "wrap_with_autocast"))
# The symbolic-size functions torch's serializer writes by module and name.
_SYM_FUNCTIONS = (
    operator.eq, operator.ne, operator.le, operator.ge, operator.lt, operator.gt, operator.neg,
    operator.pos, operator.mul, operator.add, operator.sub, operator.floordiv, operator.mod,
    operator.pow, operator.truediv, operator.and_, operator.or_, operator.lshift,
    operator.rshift, math.trunc, torch.sym_not, torch.sym_int, torch.sym_float, torch.sym_ite,
    torch.sym_max, torch.sym_min, *(f for f in (getattr(torch, "_sym_sqrt", None),) if f),
)
_SYM_NAMES = frozenset(f"{f.__module__}.{f.__name__}" for f in _SYM_FUNCTIONS)
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ATEN = re.compile(rf"torch\.ops\.aten\.({_NAME})\.({_NAME})")
_HOP = re.compile(rf"torch\.ops\.higher_order\.({_NAME})")


def check_graph_json(graph: Any) -> None:
    """Refuse a decoded ``torch.export`` graph JSON unless every node's operator is allowed.

    Walks the whole document, so nodes of subgraphs (``as_graph`` arguments)
    are checked as well as operators passed as arguments (``as_operator``).

    Raises:
        ForbiddenOperator: naming the node, its source line and the operator.

    Example:
        >>> node = {"name": "t", "target": "torch.ops.aten.from_file.default",
        ...         "inputs": [], "outputs": [], "metadata": {}}
        >>> try:
        ...     check_graph_json({"graph": {"nodes": [node]}})
        ... except ForbiddenOperator as e:
        ...     print(str(e)[:64])
        node 't' calls aten.from_file.default, which reads and writes fi
    """
    known = dispatcher_operator_names()
    for node in _dicts(graph):
        if {"target", "inputs", "outputs"} <= node.keys():
            reason = _refusal(node["target"], known) or _argument_refusal(node["inputs"])
            if reason:
                raise ForbiddenOperator(f"node {_short(_node_name(node))} calls "
                                        f"{_op_text(node['target'])}{_source(node)}, which "
                                        f"{reason}; {_RULE}")
        if "as_operator" in node and (reason := _refusal(node["as_operator"], known)):
            raise ForbiddenOperator(f"an argument names {_op_text(node['as_operator'])}, which "
                                    f"{reason}; {_RULE}")
        if "as_custom_obj" in node:
            raise ForbiddenOperator("an argument is a torchbind object, whose methods are code "
                                    f"outside the graph; {_RULE}")


def check_graph_module(module: torch.nn.Module) -> None:
    """The same rule on a built graph module and every subgraph module in it.

    Raises:
        ForbiddenOperator: naming the node and its operator.
    """
    known = dispatcher_operator_names()
    for sub in module.modules():
        graph = getattr(sub, "graph", None)
        for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
            if node.op not in ("call_function", "call_method", "call_module"):
                continue  # placeholders, outputs and attribute reads call nothing
            reason = (f"is a {node.op} node" if node.op != "call_function"
                      else _target_refusal(node.target, known))
            if reason is None and node.kwargs.get("pin_memory") is True:
                reason = "pins host memory of the process (pin_memory=True)"
            if reason:
                where = node.meta.get("stack_trace") or ""
                raise ForbiddenOperator(f"node {node.name!r} calls {node.target}"
                                        f"{_source({'metadata': {'stack_trace': where}})}, "
                                        f"which {reason}; {_RULE}")


_RULE = ("a program read from a file may call only tensor operators "
         "(torchdefer.descriptors._operators says which)")


def _refusal(target: Any, known: frozenset[str]) -> str | None:
    """Why a serialized target is refused, or ``None`` when it is allowed."""
    if not isinstance(target, str):
        return "is not an operator name"
    if target in _SYM_NAMES:
        return None
    if m := _HOP.fullmatch(target):
        return None if m[1] in _HIGHER_ORDER else _HOP_REASON
    if m := _ATEN.fullmatch(target):
        return _aten_refusal(m[1], m[2], known)
    return "is outside the allowed operators (aten tensor math, size arithmetic, subgraph calls)"


_HOP_REASON = "is a higher-order operator that can call code outside the file's subgraphs"


def refusal_for_aten(name: str) -> str | None:
    """Why every overload of ``aten::<name>`` is refused, or ``None``.

    >>> refusal_for_aten("from_file")
    'reads and writes files (shared=True maps the file into memory)'
    """
    if name in _DENIED:
        return _DENIED[name]
    if name.startswith("_test_"):
        return "is an operator for PyTorch's own tests"
    if "_backward" in name:  # export graphs are forward graphs; these kernels trust their
        return _BACKWARD  # forward's indices (max_pool2d_with_indices_backward writes anywhere)
    if "sparse" in name and ("tensor" in name or name.startswith("sparse_resize")) and (
            not name.startswith("_validate")):
        return _UNCHECKED_SPARSE  # every sparse constructor: none checks its indices by default
    return None


def _aten_refusal(name: str, overload: str, known: frozenset[str]) -> str | None:
    if reason := refusal_for_aten(name):
        return reason
    if name in ("set", "set_") and overload.startswith("source_Storage"):
        return _STORAGE
    qualified = f"aten::{name}" if overload == "default" else f"aten::{name}.{overload}"
    if qualified not in known:
        return "is not a tensor operator registered with PyTorch's dispatcher"
    return None


def _target_refusal(target: Any, known: frozenset[str]) -> str | None:
    if isinstance(target, OpOverload):
        if target.namespace != "aten":
            return _refusal(f"torch.ops.{target.namespace}", known)
        return _aten_refusal(target._schema.name.split("::", 1)[1], target._overloadname, known)
    if isinstance(target, HigherOrderOperator):
        return None if target.name() in _HIGHER_ORDER else _HOP_REASON
    if target is operator.getitem or any(target is f for f in _SYM_FUNCTIONS):
        return None  # getitem: a multi-output operator's n-th result
    return _refusal(repr(target), known)


def _argument_refusal(inputs: Any) -> str | None:
    for argument in inputs if isinstance(inputs, list) else ():
        if (isinstance(argument, dict) and argument.get("name") == "pin_memory"
                and isinstance(argument.get("arg"), dict)
                and argument["arg"].get("as_bool") is True):
            return "pins host memory of the process (pin_memory=True)"
    return None


def _dicts(data: Any) -> Iterator[dict[str, Any]]:
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack += item.values()
        elif isinstance(item, list):
            stack += item


def _node_name(node: dict[str, Any]) -> Any:
    """A JSON node's name: its own field (torch >= 2.9's format) or, where the format
    has none (torch 2.8), the name of its first tensor output."""
    if "name" in node:
        return node["name"]
    for out in node.get("outputs") or ():
        tensor = out.get("as_tensor") if isinstance(out, dict) else None
        if isinstance(tensor, dict) and "name" in tensor:
            return tensor["name"]
    return None


def _short(text: Any, limit: int = 120) -> str:
    """A file's text in a message: quoted, escaped, cut short."""
    text = repr(text)
    return text if len(text) <= limit else text[:limit] + "...'"


def _op_text(target: Any) -> str:
    return target.removeprefix("torch.ops.") if isinstance(target, str) and len(
        target) < 200 else _short(target)


def _source(node: dict[str, Any]) -> str:
    """`` (from File "m.py", line 4, in forward)``: the user's line the node came
    from, as the node's recorded stack names it (innermost frame outside torch)."""
    metadata = node.get("metadata")
    trace = metadata.get("stack_trace") if isinstance(metadata, dict) else None
    frames = _FRAME.findall(trace) if isinstance(trace, str) else []
    users = [f for f in frames if not is_library_file(f[0])]
    if not users:  # torch's or torchdefer's own lines would only mislead
        return ""
    path, line, function = users[-1]
    text = f'File "{path}", line {line}, in {function}'[:200]
    return " (from " + "".join(c if c.isprintable() else "?" for c in text) + ")"


_FRAME = re.compile(r'File "([^"\n]+)", line (\d+), in ([^\n]+)')
