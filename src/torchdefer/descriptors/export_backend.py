"""The ``torch.export`` backend: one exported graph per concrete case, each
run only on the calls it is sound for.

How a variant is built, and why:

* **No real tensor is touched.** Example inputs and the module's weights are
  fake tensors (shape, dtype, device, no storage), so scripting a 70B or a
  deferred model allocates nothing. At call time the graph reads the live
  weights by name (``weights.py``).
* **Symbolic names are shared ``Dim`` objects**, one per string, with the
  merged ``dim_ranges``; ``None`` dims get one each; ``int`` arguments are
  ``Dim.DYNAMIC``. Example lengths are >= 2 and distinct per symbol.
* **Values are closed over**: a wrapper rebuilds the call from the graph
  inputs and the ``Value`` leaves, so export folds the branches they decide.
* **Coverage is explicit.** Export assumes every symbolic size is >= 2 and
  keeps the guards it needed (``n != 1``); a graph traced at ``b=2`` may
  answer wrongly at ``b=1`` (code branching on ``x.shape[0] == 1``). The
  ShapeEnv's value ranges and guards are kept as a :class:`Coverage`, checked
  on each call; a call outside it gets a variant with the offending symbols
  fixed to the call's values (see ``program.py``).
* **Contradictions are translated** from the ShapeEnv's guard records into a
  :class:`DescriptorConflict` in the descriptors' names, with the model line
  that added each guard.
"""

from __future__ import annotations

import contextlib
import inspect
import keyword
import random
import linecache
import os
import re
import sysconfig
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from torchdefer.descriptors import _torch
from torchdefer.descriptors._expr import evaluate, parse
from torchdefer.descriptors.checker import Param, is_dynamic
from torchdefer.descriptors.errors import DescriptorConflict
from torchdefer.descriptors.meta_tensor_type import DimRange, MetaTensorType
from torchdefer.descriptors.outputs import OutputRecipe, describe_output
from torchdefer.descriptors.tree import Node, TypeOf, Value, leaves_with_paths
from torchdefer.descriptors.weights import Weights

__all__ = ["Coverage", "ExportRunner", "build"]

Key = Any
"""A symbol as the checker binds it: a name, ``(path, dim)`` or ``(path,)``."""

_V = re.compile(r"v\d+")


@dataclass(frozen=True, slots=True)
class Coverage:
    """The calls a variant's graph is sound for, over the checker's symbols.

    Args:
        keys: the symbols; guards write the i-th as ``v{i}``.
        ranges: ``(i, min, max)`` value ranges (``None``: unbounded).
        guards: sympy conditions over ``v{i}`` that must hold.
    """

    keys: tuple[Key, ...] = ()
    ranges: tuple[tuple[int, int | None, int | None], ...] = ()
    guards: tuple[Any, ...] = ()

    def uncovered(self, env: Mapping[Key, int]) -> dict[Key, int]:
        """The symbols (with the call's values) that take the call outside."""
        out = {}
        for i, lo, hi in self.ranges:
            value = env[self.keys[i]]
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                out[self.keys[i]] = value
        if self.guards:
            values = {f"v{i}": env[k] for i, k in enumerate(self.keys)}
            for guard in self.guards:
                if evaluate(guard, values) is not True:
                    keys = [self.keys[int(s.name[1:])] for s in guard.free_symbols]
                    # Fix the unnamed sizes a guard ties to named ones, keeping names symbolic.
                    unnamed = [k for k in keys if not isinstance(k, str)]
                    out.update((k, env[k]) for k in unnamed or keys)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"keys": [k if isinstance(k, str) else list(k) for k in self.keys],
                "ranges": [list(r) for r in self.ranges], "guards": [str(g) for g in self.guards]}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Coverage:
        """Guards are read with the restricted parser: a file cannot run code here."""
        return cls(tuple(k if isinstance(k, str) else tuple(k) for k in data["keys"]),
                   tuple((int(i), lo, hi) for i, lo, hi in data["ranges"]),
                   tuple(parse(g, _V) for g in data["guards"]))  # fmt: skip


class ExportRunner:
    """Runs one exported graph on checked calls, with weights read per call.

    Args:
        program: the exported program (its own weights may be fake or meta).
        params: the program's parameters (which argument feeds which input).
        concrete: the concrete descriptor tree per parameter it was built for.
        recipe: how to rebuild the model's output from the graph's outputs.
        coverage: the calls it is sound for.
        weights: where to read the weights on each call.
        qualname: the program's name, for messages.
    """

    def __init__(self, program: ExportedProgram, params: tuple[Param, ...], concrete: Mapping[str, Node],
                 recipe: OutputRecipe, coverage: Coverage, weights: Weights, qualname: str) -> None:  # fmt: skip
        self.program, self.params, self.concrete = program, params, dict(concrete)
        self.recipe, self.coverage, self.qualname = recipe, coverage, qualname
        self.gm = program.graph_module
        signature = program.graph_signature
        specs = signature.input_specs
        lifted = [s for s in specs if s.kind is not InputKind.USER_INPUT]
        held = [s for s in lifted if s.kind in (InputKind.PARAMETER, InputKind.BUFFER)]
        constants = [s for s in lifted if s.kind is InputKind.CONSTANT_TENSOR]
        if specs[: len(lifted)] != held + constants:
            raise TypeError(f"{qualname}: unsupported exported graph inputs {[s.kind.name for s in specs]}")
        if any(s.kind is not OutputKind.USER_OUTPUT for s in signature.output_specs):
            raise TypeError(f"{qualname}: the exported graph writes back buffers or inputs, "
                            "which this backend does not run; use backend='jit'")  # fmt: skip
        # Non-persistent buffers sit in ``constants``; they are read live too.
        self.held = {s.target: program.state_dict.get(s.target, program.constants.get(s.target)) for s in held}
        self.weights = weights
        metas = [(t.dtype, tuple(t.shape)) for t in self.held.values()]
        self.resolve = weights.resolver(list(self.held), metas, qualname)
        self.constants = [program.constants[s.target] for s in constants]
        self.picks = _picks(params, self.concrete)
        self.names = _symbol_names(program, params, self.concrete)

    def __call__(self, args: tuple[Any, ...]) -> Any:
        flat: list[Any] = []
        for i, spec, indices in self.picks:
            if spec is None:
                flat.append(args[i])
            else:
                items = spec.flatten_up_to(args[i])
                flat.extend(items[j] for j in indices)
        out = self.gm(*self.resolve(), *self.constants, *flat)
        return self.recipe.rebuild(iter(out))

    def with_weights(self, weights: Weights) -> ExportRunner:
        return ExportRunner(self.program, self.params, self.concrete, self.recipe, self.coverage,
                            weights, self.qualname)  # fmt: skip

    @property
    def graph(self) -> str:
        header = "".join(f"# {sym} = {name or shown}\n" for sym, (shown, name) in self.names.items())
        return header + self.gm.print_readable(print_output=False)

    def output_descriptors(self, ranges: Mapping[str, DimRange]) -> Any:
        """Descriptors of the outputs, nested like them, in the inputs' names."""
        output = next(n for n in self.gm.graph.nodes if n.op == "output")
        names = {sym: name for sym, (_, name) in self.names.items()}
        vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in output.args[0]]
        return self.recipe.rebuild(iter(describe_output(v, names, ranges) for v in vals))


def _graph_inputs(params: tuple[Param, ...], concrete: Mapping[str, Node]) -> list[tuple[str, Node]]:
    """``(path, leaf)`` of every graph input, in the graph's order."""
    return [(path, leaf) for p in params if p.name in concrete
            for path, leaf in leaves_with_paths(concrete[p.name], p.name) if is_dynamic(leaf)]  # fmt: skip


def _symbol_names(program: ExportedProgram, params: tuple[Param, ...],
                  concrete: Mapping[str, Node]) -> dict[str, tuple[str, str | None]]:  # fmt: skip
    """Export symbol -> (how messages show it, descriptor name or ``None`` for a
    ``None`` dim), read from the graph's placeholders."""
    user = set(program.graph_signature.user_inputs)
    nodes = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in user]
    out: dict[str, tuple[str, str | None]] = {}
    for (path, leaf), node in zip(_graph_inputs(params, concrete), nodes):
        val = node.meta.get("val")
        if isinstance(leaf, TypeOf):
            if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol:
                out.setdefault(str(val.node.expr), (path, path))
            continue
        for i, (d, size) in enumerate(zip(leaf.shape, val.shape)):
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol and not isinstance(d, int):
                out.setdefault(str(size.node.expr), (d or f"{path}.shape[{i}]", d))
    return out


def _picks(params: tuple[Param, ...], concrete: Mapping[str, Node]) -> list[tuple[int, Any, list[int]]]:
    """Per parameter feeding the graph: (index, None) for a leaf, or (index,
    pytree spec, positions of its dynamic leaves)."""
    picks = []
    for i, p in enumerate(params):
        node = concrete.get(p.name)
        if node is None or isinstance(node, Value):
            continue
        if is_dynamic(node):
            picks.append((i, None, []))
            continue
        leaves, spec = pytree.tree_flatten(node)
        dynamic = [j for j, leaf in enumerate(leaves) if is_dynamic(leaf)]
        if dynamic:
            picks.append((i, spec, dynamic))
    return picks


# ------------------------------------------------------------------- build
class _Bound(torch.nn.Module):
    """Calls the target with the graph inputs put back in place and values baked in.

    Shares the target's parameter/buffer/submodule dicts, so export lifts the
    weights under the model's own names (``layers.0.weight``).
    """

    def __init__(self, target: Callable[..., Any], params: tuple[Param, ...],
                 concrete: Mapping[str, Node], input_names: list[str]) -> None:  # fmt: skip
        super().__init__()
        if isinstance(target, torch.nn.Module):
            for attr in ("_parameters", "_buffers", "_modules"):
                object.__setattr__(self, attr, getattr(target, attr))
            self.training = target.training
        # Export snapshots and restores module attributes around tracing, so
        # the recipe lives in the closure, not on the module.
        recipes: list[OutputRecipe] = []
        self.recipes = lambda: recipes
        specs = [(p, *pytree.tree_flatten(concrete[p.name])[::-1]) for p in params if p.name in concrete]

        def forward(*dynamic: Any) -> Any:
            stream = iter(dynamic)
            args, kwargs = [], {}
            for p, spec, leaves in specs:
                value = pytree.tree_unflatten(
                    [leaf.value if isinstance(leaf, Value) else next(stream) for leaf in leaves], spec
                )
                if p.kind == "POSITIONAL_ONLY":
                    args.append(value)
                else:
                    kwargs[p.name] = value
            flat, recipe = OutputRecipe.capture(target(*args, **kwargs))
            recipes.append(recipe)
            return tuple(flat)

        forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in input_names]
        )
        self.forward = forward


def build(target: Callable[..., Any], params: tuple[Param, ...], concrete: Mapping[str, Node],
          ranges: Mapping[str, DimRange], weights: Weights, qualname: str,
          sizes: Mapping[Key, int] | None = None) -> ExportRunner:  # fmt: skip
    """Export ``target`` for one concrete case.

    Args:
        target: the module or function.
        params: its parameters; ``concrete`` holds a tree for each accepted one.
        concrete: from :func:`~torchdefer.descriptors.checker.concretize`.
        ranges: ``(min, max)`` per symbolic name.
        weights: where the runner reads weights.
        qualname: for messages.
        sizes: the sizes of the call this case is built for, used as example
            values (>= 2) so the trace sees inputs the code accepts.

    Raises:
        DescriptorConflict: the code contradicts a symbolic dimension, or
            tracing failed (the message names the model's line).
    """
    leaves = _graph_inputs(params, concrete)
    plan = _Plan(leaves, ranges, sizes or {})
    wrapper = _Bound(target, params, concrete, plan.input_names)
    metadata = _weight_metadata(wrapper)
    with _torch.fake_mode():
        examples = plan.examples()
        state = _fake_state(metadata)
    with _torch.export_tracing() as shape_env, _torch.reparametrize(wrapper, state), _kept(target):
        try:
            program = torch.export.export(wrapper, tuple(examples), dynamic_shapes=tuple(plan.specs),
                                          strict=False)  # fmt: skip
        except Exception as e:
            raise DescriptorConflict(*_conflict(e, shape_env, plan, qualname)) from e
    coverage = _coverage(program, shape_env, leaves)
    return ExportRunner(program, params, concrete, wrapper.recipes()[-1], coverage, weights, qualname)


@contextlib.contextmanager
def _kept(target: Any) -> Iterator[None]:
    """Restore attributes the model's forward assigns while traced (they would
    hold fake tensors afterwards); export does this only for its root module."""
    modules = list(target.modules()) if isinstance(target, torch.nn.Module) else []
    saved = [(m, dict(m.__dict__)) for m in modules]
    try:
        yield
    finally:
        for m, attrs in saved:
            if m.__dict__.keys() != attrs.keys() or any(m.__dict__[k] is not v for k, v in attrs.items()):
                m.__dict__.clear()
                m.__dict__.update(attrs)


class _Plan:
    """``Dim``s and example values for the graph inputs of one variant."""

    def __init__(self, leaves: list[tuple[str, Node]], ranges: Mapping[str, DimRange],
                 sizes: Mapping[Key, int]) -> None:  # fmt: skip
        self.leaves, self.sizes = leaves, sizes
        self.input_names = _identifiers([path for path, _ in leaves])
        self.taken = {d for _, leaf in leaves if isinstance(leaf, MetaTensorType)
                      for d in leaf.shape if isinstance(d, int)}  # fmt: skip
        self.dims: dict[Key, Any] = {}
        self.hints: dict[Key, int] = {}
        self.display: dict[Key, str] = {}  # how messages write each symbol
        self.bounds: dict[Key, tuple[int, int | None]] = {}
        self.specs: list[Any] = []
        for path, leaf in leaves:
            if isinstance(leaf, TypeOf):
                self._symbol((path,), path, (0, None))
                self.specs.append(Dim.AUTO)
                continue
            spec = {}
            for i, d in enumerate(leaf.shape):
                if isinstance(d, str):
                    spec[i] = self._symbol(d, d, ranges.get(d, (0, None)))
                elif d is None:
                    self._symbol((path, i), f"{path}.shape[{i}]", (0, None))
                    spec[i] = Dim.AUTO
            self.specs.append(spec or None)

    def _symbol(self, key: Key, display: str, bounds: tuple[int, int | None]) -> Any:
        """The ``Dim`` of a named size, with a distinct example value >= 2 inside
        its range: 0 and 1 are export's special cases, and equal examples could
        make it merge two symbols. ``None`` dims and ints are ``Dim.AUTO``: the
        code may tie or fix them, and coverage records what it did."""
        if key not in self.hints:
            lo, hi = bounds
            value = max(lo, 2)
            while value in self.taken and (hi is None or value < hi):
                value += 1
            given = self.sizes.get(key, 0)
            self.hints[key] = given if given >= 2 else value if hi is None else min(value, hi)
            self.taken.add(self.hints[key])
            self.display[key], self.bounds[key] = display, bounds
            if isinstance(key, str):
                ok = display.isidentifier() and not keyword.iskeyword(display)
                name = display if ok else f"d{len(self.dims)}"
                self.dims[key] = Dim(name, min=lo, **({} if hi is None else {"max": hi}))
        return self.dims.get(key)

    def examples(self) -> list[Any]:
        out: list[Any] = []
        for path, leaf in self.leaves:
            if isinstance(leaf, TypeOf):
                out.append(self.hints[(path,)])
                continue
            sizes = [d if isinstance(d, int) else self.hints[d if isinstance(d, str) else (path, i)]
                     for i, d in enumerate(leaf.shape)]  # fmt: skip
            t = torch.empty(sizes, dtype=leaf.dtype, device=leaf.device)
            out.append(t.requires_grad_() if leaf.requires_grad else t)
        return out


def _identifiers(paths: list[str]) -> list[str]:
    """Python identifiers for leaf paths (``inp['b'][1]`` -> ``inp_b_1``), unique."""
    names: list[str] = []
    for path in paths:
        base = re.sub(r"\W+", "_", path).strip("_") or "arg"
        base = base if base.isidentifier() else f"arg_{base}"
        name, k = base, 1
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.append(name)
    return names


def _weight_metadata(wrapper: torch.nn.Module) -> list[tuple[str, int, tuple[Any, ...]]]:
    """``(name, identity, metadata)`` per weight, read outside any fake mode:
    deferred tensors answer metadata through their own dispatch."""
    named = [*wrapper.named_parameters(remove_duplicate=False), *wrapper.named_buffers(remove_duplicate=False)]
    return [(name, id(t), (tuple(t.shape), tuple(t.stride()), t.dtype, t.device,
                           isinstance(t, torch.nn.Parameter), t.requires_grad)) for name, t in named]  # fmt: skip


def _fake_state(metadata: list[tuple[str, int, tuple[Any, ...]]]) -> dict[str, torch.Tensor]:
    """Fake twins (tying kept), made in the active fake mode: no storage at all."""
    twins: dict[int, torch.Tensor] = {}
    state = {}
    for name, identity, (shape, stride, dtype, device, is_param, grad) in metadata:
        if identity not in twins:
            twin = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            twins[identity] = torch.nn.Parameter(twin, grad) if is_param else twin
        state[name] = twins[identity]
    return state


def _coverage(program: ExportedProgram, shape_env: Any, leaves: list[tuple[str, Node]]) -> Coverage:
    """What the graph assumed about each symbol -- the ShapeEnv's value ranges
    (sizes >= 2) and guards -- over the checker's keys."""
    user = set(program.graph_signature.user_inputs)
    nodes = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in user]
    keys: dict[Key, int] = {}
    symbols: dict[Any, sympy.Symbol] = {}  # export symbol -> v{i}
    ranges: list[tuple[int, int | None, int | None]] = []
    fixed: list[tuple[sympy.Symbol, Any]] = []

    def add(key: Key, size: Any) -> None:
        v = sympy.Symbol(f"v{keys.setdefault(key, len(keys))}", integer=True)
        expr = size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)
        if not expr.is_Symbol or expr in symbols:
            fixed.append((v, expr))  # specialized by the code, or tied to another symbol
            return
        symbols[expr] = v
        vr = shape_env.var_to_range.get(expr)
        lo, hi = (None, None) if vr is None else (_finite(vr.lower), _finite(vr.upper))
        if lo is not None or hi is not None:
            ranges.append((keys[key], lo, hi))

    for (path, leaf), node in zip(leaves, nodes):
        val = node.meta["val"]
        if isinstance(leaf, TypeOf):
            add((path,), val)
        else:
            for i, (d, size) in enumerate(zip(leaf.shape, val.shape)):
                if not isinstance(d, int):
                    add(d if isinstance(d, str) else (path, i), size)
    guards = [sympy.Eq(v, expr.xreplace(symbols)) for v, expr in fixed]
    guards += [g.expr.xreplace(symbols) for g in shape_env.guards
               if g.expr.free_symbols and g.expr.free_symbols <= symbols.keys()]  # fmt: skip
    return Coverage(tuple(keys), tuple(ranges), tuple(dict.fromkeys(guards)))


def _finite(bound: Any) -> int | None:
    return int(bound) if bound.is_Integer else None


# --------------------------------------------------------------- conflicts
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def _restricts(expr: Any, display: Mapping[str, str], bounds: Mapping[str, tuple[int, int | None]]) -> bool:
    """Whether a guard excludes lengths the descriptors allow, tried on sample
    lengths in range, one per descriptor name (so ``Eq(Mod(b*t, b), 0)``, true
    for every length, is not reported)."""
    shown = {s.name: display.get(s.name, s.name) for s in expr.free_symbols}
    if not any(d in bounds for d in shown.values()):
        return False
    rng = random.Random(0)
    candidates = (2, 3, 4, 5, 7, 8, 16, 31, 64, 97, 128, 1000)
    for attempt in range(len(candidates) + 32):  # all names equal first, then at random
        pick: dict[str, int] = {}
        for name in shown.values():
            lo, hi = bounds.get(name, (2, None))
            allowed = [v for v in candidates if max(lo, 2) <= v <= (hi or v)] or [max(lo, 2)]
            pick[name] = allowed[attempt % len(allowed)] if attempt < len(candidates) else rng.choice(allowed)
        if evaluate(expr, {s: pick[d] for s, d in shown.items()}) is not True:
            return True
    return False


def _user_line(filename: str, lineno: int, name: str) -> str:
    return f"{filename}:{lineno} in {name}: {linecache.getline(filename, lineno).strip()}"


def _conflict(error: Exception, shape_env: Any, plan: _Plan, qualname: str) -> tuple[str, list[str]]:
    """The message and dims of a :class:`DescriptorConflict`, from the ShapeEnv's
    guard records, in the descriptors' names."""
    by_input = dict(zip(plan.input_names, plan.leaves))
    display: dict[str, str] = {}  # export symbol name -> descriptor name
    strict: dict[str, tuple[int, int | None]] = {}  # tensor-dim symbols (may not be specialized)
    for symbol, (name, dim) in _torch.symbol_sources(shape_env).items():
        if name in by_input:
            path, leaf = by_input[name]
            d = None if dim is None else leaf.shape[dim]
            key = (path,) if dim is None else (d if isinstance(d, str) else (path, dim))
            display[symbol.name] = plan.display.get(key, symbol.name)
            if dim is not None:
                strict[symbol.name] = plan.bounds.get(key, (0, None))

    def shown(expr: Any) -> Any:
        return expr.xreplace({s: sympy.Symbol(display[s.name]) for s in expr.free_symbols if s.name in display})

    if isinstance(error, torch._dynamo.exc.UserError) and (
        error.error_type is torch._dynamo.exc.UserErrorType.CONSTRAINT_VIOLATION
    ):
        bounds = {display[n]: b for n, b in strict.items()}
        guards = [(g, {display[s.name] for s in g.expr.free_symbols if s.name in strict})
                  for g in shape_env.guards if _restricts(g.expr, display, bounds)]  # fmt: skip
        dims = sorted({d for _, ds in guards for d in ds})
        lines = [f"{qualname}: the model's code contradicts the input descriptors."]
        if dims:
            names = ", ".join(map(repr, dims))
            lines.append(f"  {names} {'is' if len(dims) == 1 else 'are'} described as symbolic, but the code requires:")
        for g, _ in guards:
            loc = g.sloc.framework_loc
            where = _user_line(loc.filename, loc.lineno, loc.name) if hasattr(loc, "lineno") else str(loc)
            lines.append(f"    {shown(g.expr)}  at {where}")
        if not dims:
            lines.append("  " + str(error).splitlines()[0])
        lines.append("  Fix the code, or describe the dimension with the length it needs "
                     "(a static int or a narrower dim_ranges).")  # fmt: skip
        return "\n".join(lines), dims
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith((_TORCH_DIR, _OWN_DIR, "<"))
              and not (f.filename.startswith(_STDLIB) and "-packages" not in f.filename)]  # fmt: skip
    where = _user_line(frames[-1].filename, frames[-1].lineno or 0, frames[-1].name) if frames else "<no user frame>"
    first = (str(error).strip().splitlines() or [""])[0]
    mentioned = set(re.findall(r"\b[su]\d+\b", first))
    text = re.sub(r"\b[su]\d+\b", lambda m: display.get(m.group(0), m.group(0)), first)
    hints = ", ".join(f"{plan.display[k]}={v}" for k, v in plan.hints.items()) or "none"
    return (f"{qualname}: tracing with the input descriptors failed at {where}\n"
            f"  {type(error).__name__}: {text}\n"
            f"  (example lengths used: {hints}). If the code needs particular lengths, describe "
            "them statically or narrow dim_ranges."), sorted({display[n] for n in mentioned & strict.keys()})  # fmt: skip
