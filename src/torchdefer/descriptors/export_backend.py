"""The ``torch.export`` backend: descriptors become example shapes and ``Dim``s.

How a program is built, and why:

* **No real tensor is touched.** Example inputs, parameters and buffers are
  fake tensors of a private ``FakeTensorMode`` (shapes, dtypes, devices, no
  storage), so scripting a 70B model or a deferred one allocates nothing.
  The program takes the weights from the live module at call time
  (``torch.func.functional_call``), which is also why it runs with the real
  weights once a deferred module is materialized.
* **Symbolic names are shared ``Dim`` objects**, one per string, with the
  merged ``dim_ranges`` as min/max. ``None`` dims and rank-only descriptors
  get one ``Dim`` each. The example length of every symbol is chosen inside
  its range and >= 2, distinct per symbol, so export does not specialize it
  away as it does for 0/1 examples; the resulting graph runs for 0 and 1 too.
* **Values are closed over.** Value-specialized leaves are baked into a
  wrapper's ``forward``; export then folds the branches they decide.
* **Contradictions are translated.** When the code forces a symbol to a
  value, export's constraint error is re-raised as :class:`DescriptorConflict`
  with the guard and the user's source line (see ``_guards``).

Export traces one dtype and one device: a tensor descriptor must give its
rank (shape or ``rank=``) and dtype; an unknown device is specialized to the
module's (CPU for functions) and that device is then checked on every call.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import Dim, ExportedProgram
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.nn.utils.stateless import _reparametrize_module

from torchdefer.descriptors._bound import Bound
from torchdefer.descriptors._guards import GuardLog, capture_guards, user_frame
from torchdefer.descriptors.errors import DescriptorConflict
from torchdefer.descriptors.meta_tensor_type import MetaTensorType
from torchdefer.descriptors.outputs import ExportSymbols, output_descriptors
from torchdefer.descriptors.specialization import Specialization
from torchdefer.descriptors.tree import Node, TypeOf

__all__ = ["ExportRunner", "build_export", "complete_for_export"]


class ExportRunner:
    """Runs an ``ExportedProgram`` with weights supplied per call.

    Args:
        program: the exported program (its own state may be fake or meta).
        symbols: export symbol -> descriptor name, for ``.graph``.
    """

    def __init__(self, program: ExportedProgram, symbols: Mapping[str, str]) -> None:
        self.program = program
        self.module = program.module()
        self.weight_names = tuple(program.state_dict)
        self.symbols = dict(symbols)

    @property
    def graph(self) -> str:
        header = "".join(f"# {sym} = {name}\n" for sym, name in self.symbols.items())
        return header + self.program.graph_module.print_readable(print_output=False)

    def run(self, flat: list[Any], weights: Mapping[str, torch.Tensor] | None) -> Any:
        if weights is None:
            return self.module(*flat)
        return torch.func.functional_call(self.module, dict(weights), tuple(flat))


def complete_for_export(spec: Specialization, device: torch.device) -> Specialization:
    """Fill what export must fix: unknown device (-> ``device``) and layout.

    Raises:
        TypeError: a tensor descriptor without rank or dtype, or a type
            descriptor export cannot make dynamic (only ``int`` can).
    """

    def fill(node: Node, path: str) -> Node:
        if isinstance(node, (tuple, list)):
            items = [fill(c, f"{path}[{i}]") for i, c in enumerate(node)]
            return tuple(items) if isinstance(node, tuple) else items
        if isinstance(node, dict):
            return {k: fill(c, f"{path}[{k!r}]") for k, c in node.items()}
        if isinstance(node, TypeOf) and node.type is not int:
            raise TypeError(
                f"backend='export' cannot take {path} as a {node.type.__name__} input (only int "
                f"can be dynamic); give a value to specialize it, or use backend='jit'"
            )
        if not isinstance(node, MetaTensorType):
            return node
        missing = [p for p in ("rank", "dtype") if getattr(node, p) is None]
        if missing:
            raise TypeError(
                f"backend='export' traces one {' and one '.join(missing)} per tensor, but the "
                f"descriptor of {path} ({node!r}) leaves {' and '.join(missing)} unknown; give "
                f"{' and '.join(missing)}=..., or use backend='jit'"
            )
        return replace(node, device=node.device or device, layout=node.layout or torch.strided)

    trees = {name: fill(tree, name) for name, tree in spec.trees.items()}
    return replace(spec, trees=trees)


def build_export(target: Callable[..., Any], spec: Specialization) -> tuple[ExportRunner, Any]:
    """Export ``target`` specialized to ``spec``.

    Returns:
        The runner and the output descriptors (nested like the outputs).

    Raises:
        DescriptorConflict: the code contradicts a symbolic dimension.
    """
    plan = _ExamplePlan(spec)
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    wrapper = Bound(target, spec)
    metadata = _weight_metadata(wrapper)
    with fake_mode:
        examples = plan.examples()
        state = _fake_state(metadata)
    with capture_guards() as log, _reparametrize_module(wrapper, state):
        try:
            program = torch.export.export(
                wrapper,
                tuple(examples),
                dynamic_shapes=dict(zip(wrapper.input_names, plan.dynamic_shapes, strict=True)),
                strict=False,
            )
        except torch._dynamo.exc.UserError as e:
            if "Constraints violated" not in str(e):
                raise
            message = _conflict_message(e, log, plan, spec, wrapper.input_names)
            raise DescriptorConflict(message) from e
        except DescriptorConflict:
            raise
        except Exception as e:
            raise DescriptorConflict(_trace_failure_message(e, plan, spec)) from e
    symbols = ExportSymbols.from_program(program, list(spec.dynamic_leaves()))
    runner = ExportRunner(program, symbols.display)
    return runner, output_descriptors(program, symbols, spec.ranges)


class _ExamplePlan:
    """Example lengths and ``Dim``s for every dynamic leaf of ``spec``."""

    def __init__(self, spec: Specialization) -> None:
        self.leaves = list(spec.dynamic_leaves())
        self.dims: dict[str, Any] = {}
        self.dim_names: dict[str, str] = {}  # export Dim name -> descriptor name/path
        self.hints: dict[str, int] = {}
        taken = {
            d
            for _, leaf in self.leaves
            if isinstance(leaf, MetaTensorType)
            for d in leaf.shape or ()
            if isinstance(d, int)
        }
        self.dynamic_shapes = [
            self._leaf_spec(path, leaf, spec, taken) for path, leaf in self.leaves
        ]

    def _leaf_spec(self, path: str, leaf: Any, spec: Specialization, taken: set[int]) -> Any:
        if isinstance(leaf, TypeOf):
            self.hints[path] = self._hint((0, None), taken)
            return Dim.DYNAMIC
        shape = leaf.shape if leaf.shape is not None else (None,) * leaf.rank
        out = {}
        for i, d in enumerate(shape):
            if isinstance(d, int):
                continue
            key = d if isinstance(d, str) else f"{path}.shape[{i}]"
            if key not in self.dims:
                lo, hi = spec.ranges.get(d, (0, None)) if isinstance(d, str) else (0, None)
                dim_name = _identifier(key, len(self.dims))
                self.dims[key] = Dim(dim_name, min=lo, **({} if hi is None else {"max": hi}))
                self.dim_names[dim_name] = key
                self.hints[key] = self._hint((lo, hi), taken)
            out[i] = self.dims[key]
        return out or None

    @staticmethod
    def _hint(bounds: tuple[int, int | None], taken: set[int]) -> int:
        lo, hi = bounds
        value = max(lo, 2)
        while value in taken and (hi is None or value < hi):
            value += 1
        value = value if hi is None else min(value, hi)
        taken.add(value)
        return value

    def examples(self) -> list[Any]:
        out = []
        for path, leaf in self.leaves:
            if isinstance(leaf, TypeOf):
                out.append(self.hints[path])
                continue
            shape = leaf.shape if leaf.shape is not None else (None,) * leaf.rank
            sizes = [
                d
                if isinstance(d, int)
                else self.hints[d if isinstance(d, str) else f"{path}.shape[{i}]"]
                for i, d in enumerate(shape)
            ]
            t = torch.empty(sizes, dtype=leaf.dtype, device=leaf.device)
            out.append(t.requires_grad_() if leaf.requires_grad else t)
        return out

    def describe_hints(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.hints.items())


def _identifier(name: str, index: int) -> str:
    if name.isidentifier() and not name.startswith("_"):
        return name
    return f"d{index}_" + re.sub(r"\W+", "_", name).strip("_")


def _weight_metadata(wrapper: torch.nn.Module) -> list[tuple[str, int, tuple[Any, ...]]]:
    """``(name, identity, metadata)`` per parameter and buffer, read outside any
    fake mode: deferred tensors answer metadata queries through their own
    dispatch, which must not run under our FakeTensorMode."""
    named = [
        *wrapper.named_parameters(remove_duplicate=False),
        *wrapper.named_buffers(remove_duplicate=False),
    ]
    return [
        (
            name,
            id(t),
            (
                tuple(t.shape),
                tuple(t.stride()),
                t.dtype,
                t.device,
                isinstance(t, torch.nn.Parameter),
                t.requires_grad,
            ),
        )
        for name, t in named
    ]


def _fake_state(metadata: list[tuple[str, int, tuple[Any, ...]]]) -> dict[str, torch.Tensor]:
    """Fake twins (tying kept) made in the active fake mode: no storage at all."""
    twins: dict[int, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    for name, identity, (shape, stride, dtype, device, is_param, grad) in metadata:
        if identity not in twins:
            twin = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            twins[identity] = torch.nn.Parameter(twin, grad) if is_param else twin
        state[name] = twins[identity]
    return state


def _conflict_message(
    error: Exception, log: GuardLog, plan: _ExamplePlan, spec: Specialization, inputs: list[str]
) -> str:
    text = str(error)
    names = re.search(r"Constraints violated \(([^)]*)\)", text)
    raw = [n.strip() for n in (names.group(1) if names else "").split(",") if n.strip()]
    violated = [plan.dim_names.get(n, n) for n in raw]
    to_name = _symbol_names(log, plan, inputs)
    lines = [f"{spec.signature.qualname}: the model's code contradicts the input descriptors."]
    for name in violated or ["?"]:
        guards = [g for g in log.guards if name in _rename(g.expr, to_name)]
        lines.append(f"  {name!r} is described as symbolic, but the code requires:")
        for g in guards or log.guards[-1:]:
            lines.append(f"    {_rename(g.expr, to_name)}  at {g.location or '<unknown line>'}")
    detail = "\n".join(f"    {line}" for line in text.splitlines()[:6] if line.strip())
    lines.append(f"  torch.export reported:\n{detail}")
    lines.append(
        "  Fix the code, or describe the dimension with the length it needs "
        "(a static int or a narrower dim_ranges)."
    )
    return "\n".join(lines)


def _trace_failure_message(error: Exception, plan: _ExamplePlan, spec: Specialization) -> str:
    frames = [
        (f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(error.__traceback__)
    ]
    where = user_frame(frames) or "<no user frame>"
    return (
        f"{spec.signature.qualname}: tracing with the input descriptors failed at {where}\n"
        f"  {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}\n"
        f"  (example lengths used: {plan.describe_hints() or 'none'}). If the code needs "
        "particular lengths, describe them statically or narrow dim_ranges."
    )


def _symbol_names(log: GuardLog, plan: _ExamplePlan, inputs: list[str]) -> dict[str, str]:
    out = {}
    for symbol, source in log.symbols.items():
        m = re.search(r"L\['(\w+)'\]\.size\(\)\[(\d+)\]", source)
        if not m or m.group(1) not in inputs:
            continue
        path, leaf = plan.leaves[inputs.index(m.group(1))]
        shape = getattr(leaf, "shape", None)
        dim = int(m.group(2))
        key = (
            shape[dim]
            if shape is not None and isinstance(shape[dim], str)
            else f"{path}.shape[{dim}]"
        )
        out[symbol] = key
    return out


def _rename(expr: str, names: Mapping[str, str]) -> str:
    return re.sub(r"\b[su]\d+\b", lambda m: names.get(m.group(0), m.group(0)), expr)
