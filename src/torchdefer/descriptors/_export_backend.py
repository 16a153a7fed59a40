"""The ``torch.export`` backend: one exported graph per concrete case, each run
only on the calls it is sound for.

* **No real tensor is touched**: example inputs and weights are fake, so
  scripting a 70B or a deferred model allocates nothing.
* **Names are shared ``Dim`` objects** with the merged ``dim_ranges``; ``None``
  dims and ``int`` arguments are ``Dim.AUTO`` (the code may tie or fix them).
  Examples are the call's own sizes when a call triggers the build, else
  distinct values >= 2 (0 and 1 are export's special cases).
* **Values are closed over**: a wrapper rebuilds the call from the graph
  inputs and the ``Value`` leaves, so export folds the branches they decide.
* **Coverage is explicit.** Export assumes symbolic sizes are >= 2 and keeps
  the guards it relied on (``n != 1``): a graph traced at ``b=2`` may answer
  wrongly at ``b=1``. The ShapeEnv's value ranges and guards become the
  graph's :class:`Coverage`, checked on every call.
"""

from __future__ import annotations

import contextlib
import inspect
import keyword
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from torchdefer._compat import export as compat
from torchdefer.descriptors._checker import Key, Param, show_key
from torchdefer.descriptors._conflict import conflict
from torchdefer.descriptors._expr import parse
from torchdefer.descriptors._meta_tensor_type import DimRange, MetaTensorType
from torchdefer.descriptors._object_of import real_spec
from torchdefer.descriptors._outputs import OutputRecipe, describe_output
from torchdefer.descriptors._tree import Node, TypeOf, Value, from_json, to_json
from torchdefer.descriptors._weights import Weights
from torchdefer.errors import DescriptorConflict, StateError, UsageError, UsageTypeError
from torchdefer.fake._source import is_library_code

__all__ = ["Coverage", "ExportRunner", "build"]

_V = re.compile(r"v\d+")  # how coverage guards name the i-th symbol


@dataclass(frozen=True, slots=True)
class Coverage:
    """The calls a graph is sound for: value ranges and guards over the
    checker's symbols (``keys``; guards write the i-th as ``v{i}``)."""

    keys: tuple[Key, ...] = ()
    ranges: tuple[tuple[int, int | None, int | None], ...] = ()  # (i, min, max)
    guards: tuple[Any, ...] = ()
    # Per guard, its (symbol, key) pairs: worked out once, not on every call.
    _symbols: tuple[tuple[tuple[Any, Key], ...], ...] = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_symbols", tuple(
            tuple((s, self.keys[int(s.name[1:])]) for s in guard.free_symbols)
            for guard in self.guards))

    def uncovered(self, env: Mapping[Key, int]) -> dict[Key, int]:
        """The symbols, with the call's values, that take the call outside."""
        out = {}
        for i, lo, hi in self.ranges:
            value = env[self.keys[i]]
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                out[self.keys[i]] = value
        for guard, symbols in zip(self.guards, self._symbols):
            if compat.evaluate(guard, {s: env[k] for s, k in symbols}) is not True:
                keys = [k for _, k in symbols]
                # Fix the unnamed sizes a guard ties to named ones; names stay symbolic.
                out.update((k, env[k]) for k in [k for k in keys if type(k) is tuple] or keys)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"keys": to_json(self.keys), "ranges": to_json(self.ranges),
                "guards": [str(g) for g in self.guards]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Coverage:
        """Guards are read with the restricted parser: a file cannot run code here."""
        keys = tuple(k if isinstance(k, str) else tuple(k) for k in from_json(data["keys"]))
        ranges = tuple((int(i), lo, hi) for i, lo, hi in from_json(data["ranges"]))
        if any(not 0 <= i < len(keys) or {type(lo), type(hi)} - {int, type(None)}
               for i, lo, hi in ranges):
            raise UsageError(f"coverage ranges {ranges} over keys {keys}")
        return cls(keys, ranges, tuple(parse(g, _V) for g in data["guards"]))


class ExportRunner:
    """Runs one exported graph (its own weights may be fake or meta) on checked
    calls, with weights read per call.

    ``concrete`` is the tree per parameter it was built for; ``training`` the
    module's flag when traced (dropout, batch norm statistics are baked in),
    checked on every call (``None``: unknown).
    """

    def __init__(self, program: ExportedProgram, params: tuple[Param, ...],
                 concrete: Mapping[str, Node], recipe: OutputRecipe, coverage: Coverage,
                 weights: Weights, qualname: str, training: bool | None = None) -> None:
        self.program, self.params, self.concrete = program, params, dict(concrete)
        self.recipe, self.coverage, self.qualname = recipe, coverage, qualname
        self.weights, self.training, self.gm = weights, training, program.graph_module
        specs, outputs = program.graph_signature.input_specs, program.graph_signature.output_specs
        lifted = [s for s in specs if s.kind is not InputKind.USER_INPUT]
        held = [s for s in lifted if s.kind in (InputKind.PARAMETER, InputKind.BUFFER)]
        constants = [s for s in lifted if s.kind is InputKind.CONSTANT_TENSOR]
        if specs[: len(lifted)] != held + constants or any(
                s.kind is not OutputKind.USER_OUTPUT for s in outputs):
            raise UsageTypeError(
                f"{qualname}: the exported graph has inputs or outputs this backend "
                f"does not run ({[s.kind.name for s in [*specs, *outputs]]})")
        # Non-persistent buffers sit in ``constants``; they are read live too.
        state, lifted_constants = program.state_dict, program.constants
        self.held = {s.target: state.get(s.target, lifted_constants.get(s.target)) for s in held}
        metas = [(t.dtype, tuple(t.shape)) for t in self.held.values()]
        self.resolve = weights.resolver(list(self.held), metas, qualname)
        self.constants = [lifted_constants[s.target] for s in constants]
        self.picks, inputs = _inputs(params, self.concrete)
        self.sizes, self.symbols = _sizes(program, inputs)

    def __call__(self, args: tuple[Any, ...]) -> Any:
        module, traced = self.weights.module, self.training
        if traced is not None and module is not None and module.training is not traced:
            mode = "train" if traced else "eval"
            raise StateError(f"{self.qualname} program was built with the model in {mode} mode, "
                             f"and the model is not any more; call model.{mode}(), or script "
                             "it again in the mode you run it in")
        flat: list[Any] = []
        for i, spec, positions in self.picks:
            if spec is None:
                flat.append(args[i])
            else:
                items = spec.flatten_up_to(args[i])
                flat.extend(items[j] for j in positions)
        return self.recipe.rebuild(iter(self.gm(*self.resolve(), *self.constants, *flat)))

    def with_weights(self, weights: Weights) -> ExportRunner:
        return ExportRunner(self.program, self.params, self.concrete, self.recipe,
                            self.coverage, weights, self.qualname, self.training)

    @property
    def graph(self) -> str:
        header = "".join(f"# {s} = {show_key(k)}\n" for s, k in self.symbols.items())
        return header + self.gm.print_readable(print_output=False)

    def output_descriptors(self, ranges: Mapping[str, DimRange]) -> Any:
        """Descriptors of the outputs, nested like them, in the inputs' names
        (sizes made from ``None`` dims are ``None``)."""
        names = {str(s): k if isinstance(k, str) else k[0] if len(k) == 1 else None
                 for s, k in self.symbols.items()}
        output = next(n for n in self.gm.graph.nodes if n.op == "output")
        vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in output.args[0]]
        return self.recipe.describe(iter(describe_output(v, names, ranges) for v in vals))


def _inputs(params: tuple[Param, ...], concrete: Mapping[str, Node]) -> tuple[list, list]:
    """The graph inputs of a case: per parameter feeding the graph ``(index,
    pytree spec or None for a bare leaf, positions of its graph inputs)``, and
    per graph input, in the graph's order, ``(path, leaf, keys)``: ``keys`` maps
    each symbolic size's dim (``None`` for an int) to its checker key."""
    picks, inputs = [], []
    for i, p in enumerate(params):
        if p.name not in concrete:
            continue
        flat, spec = pytree.tree_flatten_with_path(concrete[p.name])
        positions = [j for j, (_, leaf) in enumerate(flat)  # graph inputs, not baked in
                     if isinstance(leaf, MetaTensorType) or leaf == TypeOf(int)]
        if positions:  # the spec flattens the call's own argument
            picks.append((i, None if spec.is_leaf() else real_spec(spec), positions))
        for kp, leaf in (flat[j] for j in positions):
            path = p.name + pytree.keystr(kp)
            keys = {None: (path,)} if isinstance(leaf, TypeOf) else {
                dim: d if isinstance(d, str) else (path, dim)
                for dim, d in enumerate(leaf.shape) if not isinstance(d, int)}
            inputs.append((path, leaf, keys))
    return picks, inputs


def _sizes(program: ExportedProgram,
           inputs: list[tuple]) -> tuple[list[tuple[Key, Any]], dict[Any, Key]]:
    """``(checker key, export expression)`` of every symbolic input size, read
    from the graph's placeholders (an int or another symbol's expression where
    the code fixed or tied it), and export symbol -> key of its first size."""
    user = set(program.graph_signature.user_inputs)
    nodes = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in user]
    sizes: list[tuple[Key, Any]] = []
    symbols: dict[Any, Key] = {}
    for (_, _, keys), node in zip(inputs, nodes):
        for dim, key in keys.items():
            size = node.meta["val"] if dim is None else node.meta["val"].shape[dim]
            expr = size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)
            sizes.append((key, expr))
            if expr.is_Symbol:
                symbols.setdefault(expr, key)
    return sizes, symbols


def build(target: Callable[..., Any], params: tuple[Param, ...], concrete: Mapping[str, Node],
          ranges: Mapping[str, DimRange], weights: Weights, qualname: str,
          sizes: Mapping[Key, int] | None = None) -> ExportRunner:
    """Export ``target`` for one concrete case (``concrete``: the tree per
    accepted parameter). ``sizes``, those of the call the case is built for,
    are the examples where >= 2, so the trace sees inputs the code accepts.

    Raises:
        DescriptorConflict: the code contradicts a symbolic dimension, or
            tracing failed (the message names the model's line).
    """
    plan = _Plan(_inputs(params, concrete)[1], ranges, sizes or {})
    recipes: list[OutputRecipe] = []  # filled by the traced call
    wrapper = _Bound(target, params, concrete, plan.names, recipes)
    with compat.example_mode():
        examples = plan.examples()  # export fakes them again, with symbolic sizes
    with compat.export_tracing(is_library_code) as mode:
        # The weights in export's own mode: torch <= 2.10 wants one mode for all.
        state = _fake_weights(wrapper, mode)
        shape_env = mode.shape_env
        with compat.reparametrize(wrapper, state), _kept(target):
            try:
                program = torch.export.export(wrapper, tuple(examples),
                                              dynamic_shapes=tuple(plan.specs), strict=False)
            except Exception as e:
                raise DescriptorConflict(*conflict(e, shape_env, plan, qualname)) from e
    training = target.training if isinstance(target, torch.nn.Module) else None
    runner = ExportRunner(program, params, concrete, recipes[-1], Coverage(), weights, qualname,
                          training)
    runner.coverage = _coverage(runner, shape_env)  # from the sizes the runner read
    return runner


class _Bound(torch.nn.Module):
    """Calls the target with the graph inputs put back in place and values baked in.

    Shares the target's parameter/buffer/submodule dicts, so export lifts the
    weights under the model's own names (``layers.0.weight``). The output's
    recipe goes to ``recipes``, not to an attribute: export restores module
    attributes after tracing.
    """

    def __init__(self, target: Callable[..., Any], params: tuple[Param, ...],
                 concrete: Mapping[str, Node], names: list[str], recipes: list) -> None:
        super().__init__()
        if isinstance(target, torch.nn.Module):
            for attr in ("_parameters", "_buffers", "_modules"):
                object.__setattr__(self, attr, getattr(target, attr))
            self.training = target.training
        trees = [(p, leaves, real_spec(spec)) for p in params if p.name in concrete
                 for leaves, spec in [pytree.tree_flatten(concrete[p.name])]]

        def forward(*dynamic: Any) -> Any:
            stream, args, kwargs = iter(dynamic), [], {}
            for p, leaves, spec in trees:
                items = [x.value if isinstance(x, Value) else next(stream) for x in leaves]
                value = pytree.tree_unflatten(items, spec)
                if p.kind == "POSITIONAL_ONLY":
                    args.append(value)
                else:
                    kwargs[p.name] = value
            flat, recipe = OutputRecipe.capture(target(*args, **kwargs))
            recipes.append(recipe)
            return tuple(flat)

        forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names])
        self.forward = forward


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
            m.__dict__.clear()
            m.__dict__.update(attrs)


class _Plan:
    """``Dim`` specs, example sizes and input names for the graph inputs of one case."""

    def __init__(self, inputs: list[tuple], ranges: Mapping[str, DimRange],
                 sizes: Mapping[Key, int]) -> None:
        self.inputs, self.ranges = inputs, ranges
        self.names = _identifiers([path for path, _, _ in inputs])
        self.hints: dict[Key, int] = {}
        dims: dict[str, Any] = {}
        # A variant's descriptors all have shapes (checker.variant).
        taken = {d for _, leaf, _ in inputs if isinstance(leaf, MetaTensorType)
                 for d in leaf.shape or () if isinstance(d, int)}
        for i, key in enumerate(dict.fromkeys(k for _, _, keys in inputs for k in keys.values())):
            lo, hi = ranges.get(key, (0, None))
            value = max(lo, 2)
            while value in taken and (hi is None or value < hi):
                value += 1
            given = sizes.get(key, 0)
            self.hints[key] = given if given >= 2 else value if hi is None else min(value, hi)
            taken.add(self.hints[key])
            if isinstance(key, str):
                ok = key.isidentifier() and not keyword.iskeyword(key)
                dims[key] = Dim(key if ok else f"d{i}", min=lo, max=hi)
        self.specs = [Dim.AUTO if isinstance(leaf, TypeOf) else
                      {dim: dims[k] if isinstance(k, str) else Dim.AUTO
                       for dim, k in keys.items()} or None
                      for _, leaf, keys in inputs]

    def examples(self) -> list[Any]:
        out: list[Any] = []
        for _, leaf, keys in self.inputs:
            if isinstance(leaf, TypeOf):
                out.append(self.hints[keys[None]])
            else:
                shape = [self.hints[keys[i]] if i in keys else d for i, d in enumerate(leaf.shape)]
                out.append(torch.empty(shape, dtype=leaf.dtype, device=leaf.device,
                                       requires_grad=bool(leaf.requires_grad)))
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


def _fake_weights(module: torch.nn.Module, mode: Any) -> dict[str, torch.Tensor]:
    """Fake twins of every weight (tying kept) in fake ``mode``, with no storage
    at all. Metadata is read outside the mode: deferred tensors answer through
    their own dispatch, which must not run under it."""
    named = [*module.named_parameters(remove_duplicate=False),
             *module.named_buffers(remove_duplicate=False)]
    metas = [(n, id(t), tuple(t.shape), t.stride(), t.dtype, t.device,
              isinstance(t, torch.nn.Parameter), t.requires_grad) for n, t in named]
    twins: dict[int, torch.Tensor] = {}
    with mode:
        for _, identity, shape, stride, dtype, device, is_param, grad in metas:
            if identity not in twins:
                twin = torch.empty_strided(shape, stride, dtype=dtype, device=device)
                twins[identity] = torch.nn.Parameter(twin, grad) if is_param else twin
    return {name: twins[identity] for name, identity, *_ in metas}


def _coverage(runner: ExportRunner, shape_env: Any) -> Coverage:
    """What the graph assumed about each input size -- the ShapeEnv's value
    ranges (sizes >= 2), its guards, and the sizes it fixed or tied -- over
    the checker's keys."""
    keys = {key: i for i, key in enumerate(dict.fromkeys(k for k, _ in runner.sizes))}
    renamed = {e: sympy.Symbol(f"v{keys[k]}", integer=True) for e, k in runner.symbols.items()}
    ranges, guards = [], []
    for key, expr in runner.sizes:
        if runner.symbols.get(expr) == key:
            vr = shape_env.var_to_range.get(expr)
            lo, hi = (None, None) if vr is None else (
                int(b) if b.is_Integer else None for b in (vr.lower, vr.upper))
            if lo is not None or hi is not None:
                ranges.append((keys[key], lo, hi))
        else:  # fixed by the code, or tied to another size
            v = sympy.Symbol(f"v{keys[key]}", integer=True)
            guards.append(sympy.Eq(v, expr.xreplace(renamed)))
    guards += [g.expr.xreplace(renamed) for g in shape_env.guards
               if g.expr.free_symbols and g.expr.free_symbols <= renamed.keys()]
    return Coverage(tuple(keys), tuple(ranges), tuple(dict.fromkeys(guards)))
