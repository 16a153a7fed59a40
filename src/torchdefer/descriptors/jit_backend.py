"""The TorchScript backend: the seed RFC's ``torch.jit.script`` with descriptors.

The model is scripted as usual, then a *copy* of its ``forward`` graph is
specialized (the scripted class's own graph is shared by every scripting of
that class, so it is never edited in place):

* each described tensor input gets a refined ``TensorType`` (dtype, device,
  static lengths, rank; symbolic lengths stay ``*``);
* each fully value-specialized argument is replaced by a constant and
  removed from the graph inputs, then constant propagation and dead-code
  elimination delete the branches it decided.

The program calls the specialized graph as a function taking the scripted
module (``self``) first, so it runs with the module's live weights.
A saved jit program stores the scripted module (``torch.jit.save``) and
re-applies the specialization from the JSON descriptors on load.

Output descriptors come from the same symbolic trace as the export backend
when the model can be exported (so symbolic names propagate); otherwise from
the graph's output types, with unknown lengths.

When ``torch.jit.script`` cannot compile the model (Hugging Face models, most
eager-only code), the backend falls back to a validated ``torch.jit.trace``;
see ``jit_trace``.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import torch

from torchdefer.descriptors.meta_tensor_type import MetaTensorType
from torchdefer.descriptors.specialization import Specialization
from torchdefer.descriptors.tree import Node, TypeOf, Value, is_constant, rebuild

__all__ = ["JitRunner", "build_jit", "load_program", "save_bytes"]


class JitRunner:
    """A specialized TorchScript graph plus the scripted module it reads from.

    Subclasses (the trace fallback) override :meth:`_prepare` to specialize
    the graph copy differently, and :meth:`run` to call it.
    """

    mode = "script"

    def __init__(self, scripted: Any, spec: Specialization) -> None:
        self.scripted = scripted
        self.is_module = isinstance(scripted, torch.jit.ScriptModule)
        method = scripted.forward if self.is_module else scripted
        graph = method.graph.copy()
        first = 1 if self.is_module else 0
        self.inputs = self._prepare(graph, spec, first)
        self.function = torch._C._create_function_from_graph("forward", graph)
        self._graph = graph

    def _prepare(self, graph: torch._C.Graph, spec: Specialization, first: int) -> list[str]:
        return _specialize(graph, spec, first)

    @property
    def graph(self) -> str:
        return str(self._graph)

    def run(self, full: Mapping[str, Any], weights: Mapping[str, torch.Tensor] | None) -> Any:
        args = [full[name] for name in self.inputs]
        if self.is_module:
            return self.function(self.scripted._c, *args)
        return self.function(*args)

    def outputs_from_types(self) -> Any:
        """Output descriptors read from the graph's output types."""
        return _outputs_from_types(self._graph)

    def header(self) -> dict[str, Any]:
        """What :func:`load_program` needs besides the TorchScript archive (JSON)."""
        return {"mode": self.mode}


def build_jit(target: Any, spec: Specialization) -> tuple[JitRunner, Any]:
    """Script ``target`` and specialize its graph to ``spec``."""
    from torchdefer.descriptors.program import _is_deferred_tensor

    if isinstance(target, torch.nn.Module) and any(
        _is_deferred_tensor(t) for t in [*target.parameters(), *target.buffers()]
    ):
        raise TypeError(
            f"backend='jit' cannot script the deferred module {spec.signature.qualname}: "
            "TorchScript needs real weights; use backend='export' (no allocation) or call "
            "torchdefer.materialize_module(model) first"
        )
    try:
        scripted = torch.jit.script(target)
    except Exception as e:
        from torchdefer.descriptors.jit_trace import build_trace

        runner: JitRunner = build_trace(target, spec, script_error=e)
    else:
        runner = JitRunner(scripted, spec)
    return runner, _output_descriptors(target, spec, runner)


def save_bytes(runner: JitRunner) -> bytes:
    buffer = io.BytesIO()
    torch.jit.save(runner.scripted, buffer)
    return buffer.getvalue()


def load_program(
    spec: Specialization, data: bytes, header: Mapping[str, Any] | None, outputs: Any
) -> Any:
    """The program saved as ``data`` (a TorchScript archive) plus its JSON ``header``.

    Args:
        spec: the specialization read from the file.
        data: the ``torch.jit.save`` archive.
        header: :meth:`JitRunner.header` as saved (``None`` in older files).
        outputs: the saved output descriptors, or ``None`` to read them from
            the graph's types.
    """
    from torchdefer.descriptors.program import Program

    scripted = torch.jit.load(io.BytesIO(data), map_location="cpu")
    mode = (header or {}).get("mode", "script")
    if mode == "trace":
        from torchdefer.descriptors.jit_trace import load_trace

        runner, outputs = load_trace(scripted, spec, header or {}, outputs)
    elif mode == "script":
        runner = JitRunner(scripted, spec)
    else:
        raise ValueError(f"saved jit program has unknown mode {mode!r} (expected script/trace)")
    if outputs is None:
        outputs = runner.outputs_from_types()
    return Program(backend="jit", spec=spec, runner=runner, output_descriptors=outputs, module=None)


def _specialize(graph: torch._C.Graph, spec: Specialization, first: int) -> list[str]:
    """Refine input types, fold value-specialized inputs; returns kept input names."""
    inputs = list(graph.inputs())[first:]
    names = [p.name for p in spec.signature.parameters]
    if len(inputs) != len(names):
        raise TypeError(
            f"backend='jit': the scripted graph of {spec.signature.qualname} has "
            f"{len(inputs)} inputs but its signature has {len(names)} parameters"
        )
    kept = []
    anchor = next(iter(graph.nodes()), None)
    for index in reversed(range(len(names))):
        name, value = names[index], inputs[index]
        tree = spec.trees.get(name)
        if tree is not None and is_constant(tree):
            constant = graph.insertConstant(rebuild(tree, iter(())))
            if anchor is not None:
                constant.node().moveBefore(anchor)
            anchor = constant.node()
            value.replaceAllUsesWith(constant)
            graph.eraseInput(first + index)
            continue
        if isinstance(tree, MetaTensorType):
            value.setType(_refined(value.type(), tree))
        kept.append(name)
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_dce(graph)
    return kept[::-1]


def _refined(base: Any, desc: MetaTensorType) -> Any:
    if not isinstance(base, torch.TensorType):
        return base
    t = base
    if desc.dtype is not None:
        t = t.with_dtype(desc.dtype)
    if desc.device is not None:
        t = t.with_device(desc.device)
    if desc.rank is not None:
        shape = desc.shape or (None,) * desc.rank
        t = t.with_sizes([d if isinstance(d, int) else None for d in shape])
    return t


def _output_descriptors(target: Any, spec: Specialization, runner: JitRunner) -> Any:
    from torchdefer.descriptors.export_backend import build_export, complete_for_export

    try:
        device = next(iter([*target.parameters(), *target.buffers()])).device
    except (AttributeError, StopIteration):
        device = torch.device("cpu")
    try:
        _, outputs = build_export(target, complete_for_export(spec, device))
    except Exception:  # not exportable or not fully described: fall back to types
        return runner.outputs_from_types()
    return outputs


def _outputs_from_types(graph: torch._C.Graph) -> Any:
    outputs = list(graph.outputs())
    described = [_from_type(o.type()) for o in outputs]
    return described[0] if len(described) == 1 else tuple(described)


def _from_type(t: Any) -> Node:
    if isinstance(t, torch.TensorType):
        sizes = t.sizes()
        return (
            MetaTensorType(sizes, t.dtype())
            if sizes is not None
            else MetaTensorType(dtype=t.dtype())
        )
    if isinstance(t, torch.TupleType):
        return tuple(_from_type(e) for e in t.elements())
    if "Tensor" in str(t):
        return MetaTensorType()
    scalar = {"int": int, "float": float, "bool": bool, "str": str}.get(str(t))
    return TypeOf(scalar) if scalar is not None else Value(None)
