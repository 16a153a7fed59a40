"""The TorchScript backend: the seed RFC's ``torch.jit.script`` with descriptors.

PyTorch is deprecating TorchScript (``torch.jit`` warns from 2.15 on);
``backend="export"`` is the default and the one to prefer. The model is
scripted as usual, then a *copy* of its ``forward`` graph (the scripted
class's own graph is shared by every scripting of that class) is specialized:
described tensor inputs get a refined ``TensorType`` (dtype, device, static
lengths, rank), and fully value-specialized arguments become constants, whose
branches constant propagation and dead-code elimination then delete. One
graph serves every call the descriptors admit: TorchScript is generic in
sizes, dtypes and lengths.

Descriptors take precedence over missing annotations: a described
parameter without an annotation is compiled with the type its descriptor
gives (``Tuple[Tensor, Tensor]``, ``int``, ``bool`` for ``flag=True``), where
TorchScript alone would assume ``Tensor``. An undescribed parameter stays
generic: typed by its annotation, else by its default's type (``=None``:
``Optional[Tensor]``), and checked by type on each call, not pinned to its
default (unless its type is one no descriptor expresses, such as a dict).

What TorchScript would get wrong is refused at ``script()`` time: a model it
cannot compile, a decorated or instance-level ``forward`` (it compiles the
undecorated source), a descriptor that contradicts a parameter's annotation,
deferred weights. On each call tensor defaults are passed as the model would,
and reassigned parameters and buffers of the live module are first copied
into the scripted one. There is no ``torch.jit.trace`` fallback: a trace
bakes in whatever Python saw (lengths, branches), which no call-time check
can detect.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import torch
import torch.utils._pytree as pytree

from torchdefer._compat import export as compat
from torchdefer.descriptors._checker import NOT_ACCEPTED, Param
from torchdefer.descriptors._export_backend import Coverage
from torchdefer.descriptors._meta_tensor_type import MetaTensorType
from torchdefer.descriptors._tree import ListOf, Node, OptionalOf, TypeOf, Value
from torchdefer.descriptors._weights import has_data, lookup
from torchdefer.errors import StateError, UsageTypeError

__all__ = ["JitRunner", "build"]

# TorchScript's type of each plain value's Python type (dtypes are passed as ints).
_KINDS = {int: "IntType", float: "FloatType", bool: "BoolType", str: "StringType",
          torch.dtype: "IntType", torch.device: "DeviceObjType"}


def build(target: Any, params: tuple[Param, ...], qualname: str) -> JitRunner:
    """Script ``target`` and specialize its graph to ``params``' descriptors.

    Raises:
        TypeError: what TorchScript cannot run faithfully, with what to do.
    """
    module = target if isinstance(target, torch.nn.Module) else None
    advice = "use backend='export' (the default)"
    weights = [*module.parameters(), *module.buffers()] if module is not None else []
    if not all(has_data(t) for t in weights):
        raise UsageTypeError(
            f"backend='jit' cannot script the deferred module {qualname}: TorchScript "
            "needs real weights; use backend='export' (no allocation) or call "
            "torchdefer.materialize_module(model) first")
    fn = type(module).forward if module is not None else target
    if module is not None and "forward" in vars(module):
        raise UsageTypeError(
            f"backend='jit': {qualname} is an instance attribute, which TorchScript "
            f"ignores (it compiles {type(module).__name__}.forward); {advice}")
    if inspect.unwrap(fn) is not fn:
        raise UsageTypeError(
            f"backend='jit': {qualname} is decorated (functools.wraps); TorchScript "
            f"compiles the undecorated source and would drop the decorator; {advice}")
    try:
        scripted = compat.jit_script(target, _annotations(fn, params))
    except Exception as e:
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
        reason = f"{type(e).__name__}: {first}" if first else type(e).__name__
        raise UsageTypeError(f"backend='jit': torch.jit.script cannot compile {qualname}: "
                             f"{reason}; {advice}") from e
    return JitRunner(scripted, params, qualname, module)


class JitRunner:
    """A specialized TorchScript graph, called with the scripted module first.

    ``live`` is the module it was scripted from, whose reassigned weights are
    copied in before each call (``None`` for a loaded program). ``params``:
    the parameters with undescribed ones made generic (the program checks
    calls against these).
    """

    coverage = Coverage()  # generic in sizes: every checked call is covered

    def __init__(self, scripted: Any, params: tuple[Param, ...], qualname: str,
                 live: torch.nn.Module | None = None) -> None:
        self.scripted = scripted
        self.is_module = isinstance(scripted, torch.jit.ScriptModule)
        method = scripted.forward if self.is_module else scripted
        graph = method.graph.copy()
        first = 1 if self.is_module else 0
        inputs = list(graph.inputs())[first:]
        if len(inputs) != len(params):
            raise UsageTypeError(
                f"backend='jit': the scripted graph of {qualname} has {len(inputs)} "
                f"inputs but its signature has {len(params)} parameters")
        schema = method.schema.arguments[first:]
        self.keep: list[int] = []
        self.defaults: dict[int, Any] = {}
        anchor = next(iter(graph.nodes()), None)
        params = tuple(_generic(p, v.type()) for p, v in zip(params, inputs))
        self.params = params
        for i in reversed(range(len(params))):
            p, value = params[i], inputs[i]
            if p.node is None:  # a tensor default: passed as TorchScript recorded it
                self.defaults[i] = schema[i].default_value
            elif not _fits(value.type(), p.node):
                raise UsageTypeError(
                    f"backend='jit': TorchScript types {qualname}() parameter {p.name!r} as "
                    f"{value.type()} (from its annotation, or Tensor where no descriptor gives "
                    f"one), but it is described as {p.node!r}; annotate the parameter to match, "
                    "or use backend='export'")
            elif (constant := _constant(p.node)) is not None:
                c = graph.insertConstant(constant[0])
                if anchor is not None:
                    c.node().moveBefore(anchor)
                anchor = c.node()
                value.replaceAllUsesWith(c)
                graph.eraseInput(first + i)
                continue
            else:
                value.setType(_refined(value.type(), p.node))
            self.keep.insert(0, i)
        compat.jit_fold(graph)
        self.function, self.graph = compat.jit_function(graph), str(graph)
        self.sync = _Sync(live, scripted) if live is not None and self.is_module else None

    def __call__(self, args: tuple[Any, ...]) -> Any:
        call = [self.defaults[i] if args[i] is NOT_ACCEPTED else args[i] for i in self.keep]
        if self.sync is not None:
            self.sync()
        return self.function(self.scripted._c, *call) if self.is_module else self.function(*call)


class _Sync:
    """Copies parameters and buffers reassigned on the live module, and its
    train/eval mode, into the scripted one, so both run alike."""

    def __init__(self, live: torch.nn.Module, scripted: Any) -> None:
        self.live, self.scripted, self.training = live, scripted, live.training
        self.slots = []
        for name, _ in [*live.named_parameters(remove_duplicate=False),
                        *live.named_buffers(remove_duplicate=False)]:
            owner, _, attr = name.rpartition(".")
            path = owner.split(".") if owner else []
            target = functools.reduce(getattr, path, scripted)._c
            self.slots.append([path, attr, live.get_submodule(owner), target, None])

    def __call__(self) -> None:
        if self.live.training is not self.training:
            self.training = self.live.training
            self.scripted.train(self.training)
        for slot in self.slots:
            path, attr, owner, target, last = slot
            try:
                m, t = lookup(self.live, path, attr)
            except KeyError:
                m = None
            if m is not owner:
                raise StateError(f"backend='jit': submodule {'.'.join(path)!r} was replaced "
                                 "after script(); script the model again")
            if t is not last:
                target.setattr(attr, t)
                slot[4] = t


def _annotations(fn: Any, params: tuple[Param, ...]) -> dict[str, str]:
    """TorchScript types for the unannotated parameters of ``fn`` that a
    descriptor or, undescribed, its default types (``=None``: ``Optional[Tensor]``)."""
    signature = inspect.signature(fn)
    out = {}
    for p in params:
        declared = signature.parameters[p.name].annotation
        if p.node is None or declared is not inspect.Parameter.empty:
            continue
        text = _torchscript_type(p.node)
        if text not in (None, "Tensor"):  # Tensor is TorchScript's own reading
            out[p.name] = text
    return out


def _torchscript_type(node: Node) -> str | None:
    """The TorchScript type text a descriptor tree admits, or ``None``."""
    if isinstance(node, MetaTensorType):
        return "Tensor"
    if isinstance(node, (TypeOf, Value)):
        kind = node.type if isinstance(node, TypeOf) else type(node.value)
        names: dict[type, str] = {type(None): "Optional[Tensor]", torch.device: "Device",
                 **{t: t.__name__ for t in (int, float, bool, str)}}
        return names.get(kind)  # a dtype has no name TorchScript reads without torch
    if isinstance(node, (ListOf, OptionalOf)):
        inner = _torchscript_type(node.element if isinstance(node, ListOf) else node.inner)
        wrap = "List" if isinstance(node, ListOf) else "Optional"
        return None if inner is None else f"{wrap}[{inner}]"
    if type(node) not in (tuple, list, dict) or not node:
        return None
    found = [_torchscript_type(n) for n in (node.values() if type(node) is dict else node)]
    items = [t for t in found if t is not None]
    if len(items) != len(found):
        return None
    if type(node) is tuple:
        return f"Tuple[{', '.join(items)}]"
    if len(set(items)) != 1 or (type(node) is dict and not all(type(k) is str for k in node)):
        return None
    return f"List[{items[0]}]" if type(node) is list else f"Dict[str, {items[0]}]"


def _generic(p: Param, t: Any) -> Param:
    """``p`` itself, or, undescribed with a plain default, the descriptor of
    any value of its TorchScript type ``t`` (kept pinned where none is)."""
    if p.described or p.node is None:
        return p
    node = _of_type(t)
    return p if node is None else dataclasses.replace(p, node=node)


def _of_type(t: Any) -> Node | None:
    kind = t.kind()
    plain = {"IntType": int, "FloatType": float, "BoolType": bool, "StringType": str}.get(kind)
    if kind == "TensorType":
        return MetaTensorType()
    if plain is not None:
        return TypeOf(plain)
    if kind in ("OptionalType", "ListType"):
        inner = _of_type(t.getElementType())
        return None if inner is None else (OptionalOf if kind == "OptionalType" else ListOf)(inner)
    if kind == "TupleType":
        items = [_of_type(e) for e in t.elements()]
        return None if None in items else tuple(items)
    return None


def _fits(t: Any, node: Node) -> bool:
    """Whether TorchScript type ``t`` accepts what ``node`` describes."""
    kind = t.kind()
    if kind == "OptionalType":
        inner = node.inner if isinstance(node, OptionalOf) else node
        return _is_none(node) or _fits(t.getElementType(), inner)
    if isinstance(node, (MetaTensorType, TypeOf, Value)) and not _is_none(node):
        want = "TensorType" if isinstance(node, MetaTensorType) else _KINDS.get(
            node.type if isinstance(node, TypeOf) else type(node.value), "?")
        return kind == want or (kind == "NumberType" and want in ("IntType", "FloatType"))
    if isinstance(node, ListOf):
        return kind == "ListType" and _fits(t.getElementType(), node.element)
    if isinstance(node, (tuple, list)) and type(node) in (tuple, list):
        if kind == "TupleType":
            return len(t.elements()) == len(node) and all(map(_fits, t.elements(), node))
        return kind == "ListType" and all(_fits(t.getElementType(), n) for n in node)
    if type(node) is dict:
        return kind == "DictType" and all(_fits(t.getValueType(), n) for n in node.values())
    return kind == "NoneType" and _is_none(node)


def _is_none(node: Node) -> bool:
    return isinstance(node, Value) and node.value is None


def _constant(node: Node) -> tuple[Any] | None:
    """``(value,)`` when ``node`` fixes the whole argument, else ``None``."""
    leaves, spec = pytree.tree_flatten(node)
    if not all(isinstance(leaf, Value) for leaf in leaves):
        return None
    value = pytree.tree_unflatten([leaf.value for leaf in leaves], spec)
    return None if isinstance(value, (list, dict)) else (value,)  # no mutable constants


def _refined(base: Any, desc: Node) -> Any:
    """``base`` with the tensor properties ``desc`` knows, also inside tuples."""
    if type(desc) is tuple and isinstance(base, torch.TupleType):
        return torch.TupleType([_refined(t, d) for t, d in zip(base.elements(), desc)])
    if not (isinstance(base, torch.TensorType) and isinstance(desc, MetaTensorType)):
        return base
    if desc.dtype is not None:
        base = base.with_dtype(desc.dtype)
    if desc.device is not None:
        base = base.with_device(desc.device)
    if desc.rank is not None:
        shape = desc.shape or (None,) * desc.rank
        base = base.with_sizes([d if isinstance(d, int) else None for d in shape])
    return base

