"""Output descriptors: the exported graph's output metadata, in descriptor terms.

Export names input lengths with its own symbols (``s17``); outputs carry
sympy expressions over them (``s17``, ``2*s17``, ``s17 + s42``). Mapping each
input symbol back to the descriptor name it came from gives outputs like
``["b", 10]`` or ``["2*b", 10]``; a length built only from ``None`` dims, or
from data (unbacked), is ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from torchdefer.descriptors.meta_tensor_type import DimRange, MetaTensorType
from torchdefer.descriptors.tree import TypeOf, Value

__all__ = ["ExportSymbols", "output_descriptors"]


@dataclass(frozen=True, slots=True)
class ExportSymbols:
    """Export symbol -> descriptor name (or ``None`` for an any-length dim)."""

    names: dict[sympy.Symbol, str | None]

    @classmethod
    def from_program(
        cls, program: ExportedProgram, dynamic: list[tuple[str, Any]]
    ) -> ExportSymbols:
        inputs = [n for n in program.graph.nodes if n.op == "placeholder"]
        user = set(program.graph_signature.user_inputs)
        user_nodes = [n for n in inputs if n.name in user]
        names: dict[sympy.Symbol, str | None] = {}
        for node, (path, leaf) in zip(user_nodes, dynamic, strict=True):
            val = node.meta.get("val")
            if isinstance(leaf, TypeOf):
                if isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol):
                    names[val.node.expr] = path
                continue
            shape = leaf.shape if leaf.shape is not None else (None,) * leaf.rank
            for want, size in zip(shape, val.shape, strict=True):
                if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                    names.setdefault(size.node.expr, want if isinstance(want, str) else None)
        return cls(names)

    @property
    def display(self) -> dict[str, str]:
        return {str(s): (n if n is not None else "any") for s, n in self.names.items()}

    def dim(self, size: int | torch.SymInt) -> int | str | None:
        if not isinstance(size, torch.SymInt):
            return int(size)
        expr = size.node.expr
        if expr.is_Integer:
            return int(expr)
        if any(self.names.get(s) is None for s in expr.free_symbols):
            return None
        return str(expr.subs({s: sympy.Symbol(n) for s, n in self.names.items() if n}))


def output_descriptors(
    program: ExportedProgram, symbols: ExportSymbols, ranges: Mapping[str, DimRange]
) -> Any:
    """Descriptors of the user outputs, unflattened to the outputs' structure."""
    output = next(n for n in program.graph.nodes if n.op == "output")
    specs = program.graph_signature.output_specs
    flat = []
    for spec, arg in zip(specs, output.args[0], strict=True):
        if spec.kind is OutputKind.USER_OUTPUT:
            flat.append(_describe_output(arg, symbols, ranges))
    return pytree.tree_unflatten(flat, program.call_spec.out_spec)


def _describe_output(arg: Any, symbols: ExportSymbols, ranges: Mapping[str, DimRange]) -> Any:
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
    if isinstance(val, torch.Tensor):
        shape = [symbols.dim(s) for s in val.shape]
        named = {d for d in shape if isinstance(d, str)}
        return MetaTensorType(
            shape,
            val.dtype,
            device=val.device,
            layout=val.layout,
            dim_ranges={n: r for n, r in ranges.items() if n in named},
        )
    if isinstance(val, torch.SymInt):
        return TypeOf(int)
    return Value(val)
