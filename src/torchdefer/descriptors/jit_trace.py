"""The jit backend's fallback: a validated ``torch.jit.trace`` when scripting fails.

Hugging Face models, and most code written for eager PyTorch, use Python
that ``torch.jit.script`` cannot compile. A trace records the ops of one
call instead, so the fallback builds that call from the descriptors:

* **Values are closed over.** The traced module calls the model with the
  value-specialized arguments baked in (``use_cache=False``), so their
  branches vanish; only the tensor leaves are graph inputs, in argument
  order. Outputs are flattened with ``torch.utils._pytree`` and rebuilt on
  every call: the program returns what the model returns (a ``ModelOutput``
  stays a ``ModelOutput``).
* **Examples come from the descriptors.** Dtype, device and static lengths
  as described; each symbolic length a size >= 3 inside its range, distinct
  per symbol, so that two dims the trace must tell apart never have equal
  lengths; integer tensors all zeros (a valid index into any embedding),
  floating ones from a fixed seed.
* **The trace is validated at script() time.** A trace is an observation
  of one call: a length that reaches Python (``int(x.shape[1])``, a branch
  on a length) is baked in as a constant. So the traced program and the
  eager model run on a second set of examples with a different length for
  every symbol, and must agree (same output structure,
  ``torch.testing.assert_close`` on every tensor). If the trace raises or
  differs, ``script()`` raises a ``TypeError`` that says so, lists the
  tracer's warnings and points to ``backend="export"``.

The validation is evidence, not proof: a length-dependent branch that both
example lengths take the same way goes unnoticed, and the descriptor check on
every call is what keeps calls inside the described ranges. What the
fallback does not do: take ``int``/``float``/``bool`` inputs (a trace takes
tensors only; give a value to specialize them) or trace deferred modules (a
trace runs the model, so it needs real weights; the backend refuses them
before scripting).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from torchdefer.descriptors._bound import Bound, leaf_names
from torchdefer.descriptors.jit_backend import JitRunner, _from_type, _refined
from torchdefer.descriptors.meta_tensor_type import MetaTensorType
from torchdefer.descriptors.specialization import Specialization
from torchdefer.descriptors.tree import TypeOf

__all__ = ["TraceRunner", "build_trace", "load_trace"]

# The first example length tried for a symbol: lengths 0 and 1 are special
# cases (broadcasting, squeezing) that a trace would silently bake in.
_FIRST_LENGTH = 3


class TraceRunner(JitRunner):
    """A traced module's graph with refined input types; rebuilds nested outputs.

    Args:
        traced: the traced module; its ``forward`` takes the tensor leaves
            of a call, flattened, and returns the output leaves as a tuple.
        spec: the specialization the trace was taken for.
        out_spec: the ``pytree`` structure of the model's outputs.
    """

    mode = "trace"

    def __init__(self, traced: Any, spec: Specialization, out_spec: pytree.TreeSpec) -> None:
        self.spec = spec
        self.out_spec = out_spec
        super().__init__(traced, spec)

    def _prepare(self, graph: torch._C.Graph, spec: Specialization, first: int) -> list[str]:
        # The trace typed every value with the example's lengths; those are
        # not the program's, so erase them and keep only what the
        # descriptors guarantee.
        torch._C._jit_pass_erase_shape_information(graph)
        inputs = list(graph.inputs())[first:]
        dynamic = list(spec.dynamic_leaves())
        if len(inputs) != len(dynamic):
            raise TypeError(
                f"backend='jit': the traced graph of {spec.signature.qualname} has "
                f"{len(inputs)} inputs but its descriptors have {len(dynamic)} tensor leaves"
            )
        names = leaf_names([path for path, _ in dynamic])
        for value, name, (_, leaf) in zip(inputs, names, dynamic, strict=True):
            value.setDebugName(name)
            if isinstance(leaf, MetaTensorType):
                value.setType(_refined(value.type(), leaf))
        return names

    def run(self, full: Mapping[str, Any], weights: Mapping[str, torch.Tensor] | None) -> Any:
        return self.run_flat(self.spec.flatten(full))

    def run_flat(self, flat: list[Any]) -> Any:
        """Run on the tensor leaves of a call; returns the rebuilt outputs."""
        out = self.function(self.scripted._c, *flat)
        return pytree.tree_unflatten(list(out), self.out_spec)

    def outputs_from_types(self) -> Any:
        (result,) = self._graph.outputs()
        described = [_from_type(t) for t in result.type().elements()]
        return pytree.tree_unflatten(described, self.out_spec)

    def header(self) -> dict[str, Any]:
        try:
            out_spec = pytree.treespec_dumps(self.out_spec)
        except Exception as e:
            raise TypeError(
                f"save(): the outputs of {self.spec.signature.qualname} have a structure "
                f"torch.utils._pytree cannot serialize ({e}); register the output type with "
                "a serialized_type_name, or save a program built with backend='export'"
            ) from e
        return {"mode": self.mode, "out_spec": out_spec}


class _NotTensorOutput(TypeError):
    """The traced model returned something other than tensors (already explained)."""


class _Traceable(torch.nn.Module):
    """Calls the target on flat tensor leaves and returns flat output leaves.

    Shares the target's parameter/buffer/submodule dicts (as ``Bound``
    does), so the traced module and its graph use the model's own names and
    live weights. ``out_spec`` is the structure of the last call's outputs.
    """

    def __init__(self, target: Any, spec: Specialization) -> None:
        super().__init__()
        bound = Bound(target, spec)
        for attr in ("_parameters", "_buffers", "_modules"):
            object.__setattr__(self, attr, getattr(bound, attr))
        self.training = bound.training
        object.__setattr__(self, "_bound", bound)
        object.__setattr__(self, "_qualname", spec.signature.qualname)
        self.out_spec: pytree.TreeSpec | None = None

    def forward(self, *dynamic: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flat, self.out_spec = _tensor_outputs(self._bound.call_target(*dynamic), self._qualname)
        return tuple(flat)


def _tensor_outputs(out: Any, qualname: str) -> tuple[list[torch.Tensor], pytree.TreeSpec]:
    """The output leaves and structure of one call.

    Raises:
        _NotTensorOutput: a leaf is not a tensor (an ``int`` length, a string).
    """
    with_paths, out_spec = pytree.tree_flatten_with_path(out)
    for path, leaf in with_paths:
        if not isinstance(leaf, torch.Tensor):
            raise _NotTensorOutput(
                f"backend='jit': torch.jit.script cannot compile {qualname}, and its trace "
                f"cannot return the {type(leaf).__name__} at output{pytree.keystr(path)}: a "
                "trace returns tensors only. Use backend='export'"
            )
    return [leaf for _, leaf in with_paths], out_spec


def build_trace(target: Any, spec: Specialization, *, script_error: Exception) -> TraceRunner:
    """Trace ``target`` on examples synthesized from ``spec``, then validate it.

    Args:
        target: the module or function ``torch.jit.script`` could not compile.
        spec: its specialization.
        script_error: why scripting failed, for the messages.

    Raises:
        TypeError: an input cannot be traced (an ``int`` descriptor, a
            tensor of unknown rank), or the trace fails or does not match
            the eager model on the second examples.
    """
    qualname = spec.signature.qualname
    why = f"torch.jit.script cannot compile {qualname} ({_first_line(script_error)})"
    device = _device_of(target)
    first, second = _example_lengths(spec)
    module = _Traceable(target, spec)
    # Tracing and validating run the model; leave the caller's RNG untouched
    # and give both validation runs the same draws (dropout in train mode).
    with torch.random.fork_rng(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", torch.jit.TracerWarning)
        examples = tuple(_examples(spec, first, device, why))
        try:
            traced = torch.jit.trace(module, examples, check_trace=False)
        except _NotTensorOutput:
            raise
        except Exception as e:
            raise TypeError(
                f"backend='jit': {why}, and torch.jit.trace failed on example inputs of lengths "
                f"{_lengths_text(first)}: {_first_line(e)}. Use backend='export'"
            ) from e
        if module.out_spec is None:  # set by the traced call; a trace always calls it
            raise RuntimeError(f"backend='jit': tracing {qualname} never called its forward")
        runner = TraceRunner(traced, spec, module.out_spec)
        problem = _validation_problem(runner, module, _examples(spec, second, device, why))
    tracer = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    for w in caught:
        if w not in tracer:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if problem is not None:
        raise TypeError(_not_traceable_message(why, first, second, problem, tracer))
    return runner


def load_trace(
    traced: Any, spec: Specialization, header: Mapping[str, Any], outputs: Any
) -> tuple[TraceRunner, Any]:
    """A runner for a loaded traced module, and its output descriptors restructured.

    Raises:
        ValueError: the saved output structure names a type not registered
            with ``torch.utils._pytree`` in this process.
    """
    try:
        out_spec = pytree.treespec_loads(header["out_spec"])
    except Exception as e:
        known = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE
        names = set(_type_names(json.loads(header["out_spec"])))
        raise ValueError(
            f"saved jit program of {spec.signature.qualname}: its outputs are built from "
            f"{sorted(n for n in names if n not in known)}, not registered with "
            "torch.utils._pytree in this process; import the modules that define them "
            "(e.g. transformers.modeling_outputs) before load()"
        ) from e
    runner = TraceRunner(traced, spec, out_spec)
    if outputs is not None:  # saved as plain JSON trees: give them the outputs' structure
        described = pytree.tree_leaves(outputs)
        if len(described) == out_spec.num_leaves:
            outputs = pytree.tree_unflatten(described, out_spec)
    return runner, outputs


# ----------------------------------------------------------------- examples
def _length_keys(spec: Specialization) -> Iterator[tuple[str, tuple[int, int | None]]]:
    """``(key, range)`` per dynamic length: a symbol, or ``path.shape[i]`` for ``None``."""
    for path, leaf in spec.dynamic_leaves():
        if not isinstance(leaf, MetaTensorType) or leaf.rank is None:
            continue
        for i, d in enumerate(leaf.shape or (None,) * leaf.rank):
            if isinstance(d, str):
                yield d, spec.ranges.get(d, (0, None))
            elif d is None:
                yield f"{path}.shape[{i}]", (0, None)


def _example_lengths(spec: Specialization) -> tuple[dict[str, int], dict[str, int]]:
    """Two example lengths per dynamic length: distinct within a set, and the
    second set avoids the first so that every symbol changes between them."""
    static = {
        d for _, leaf in _tensor_leaves(spec) for d in (leaf.shape or ()) if isinstance(d, int)
    }
    keys = dict(_length_keys(spec))
    first = _pick_lengths(keys, set(static))
    second = _pick_lengths(keys, static | set(first.values()))
    return first, second


def _tensor_leaves(spec: Specialization) -> Iterator[tuple[str, MetaTensorType]]:
    for path, leaf in spec.dynamic_leaves():
        if isinstance(leaf, MetaTensorType):
            yield path, leaf


def _pick_lengths(keys: Mapping[str, tuple[int, int | None]], taken: set[int]) -> dict[str, int]:
    out = {}
    for key, (lo, hi) in keys.items():
        value = max(lo, _FIRST_LENGTH)
        while value in taken and (hi is None or value < hi):
            value += 1
        out[key] = value if hi is None else min(value, hi)
        taken.add(out[key])
    return out


def _examples(
    spec: Specialization, lengths: Mapping[str, int], device: torch.device, why: str
) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    out = []
    for path, leaf in spec.dynamic_leaves():
        if isinstance(leaf, TypeOf) or leaf.rank is None:
            raise TypeError(
                f"backend='jit': {why}; tracing it needs an example of {path}, but "
                + (
                    f"{path} is described as {leaf!r} and a trace takes tensors only; give a "
                    "value to specialize it"
                    if isinstance(leaf, TypeOf)
                    else f"its descriptor {leaf!r} leaves the rank unknown; give shape=[...] "
                    "or rank=..."
                )
                + ", or use backend='export'"
            )
        shape = [
            d if isinstance(d, int) else lengths[d if isinstance(d, str) else f"{path}.shape[{i}]"]
            for i, d in enumerate(leaf.shape or (None,) * leaf.rank)
        ]
        dtype = leaf.dtype or torch.get_default_dtype()
        if dtype.is_floating_point or dtype.is_complex:
            t = torch.randn(shape, dtype=dtype, generator=generator)
        else:
            t = torch.zeros(shape, dtype=dtype)
        t = t.to(leaf.device or device)
        out.append(t.requires_grad_() if leaf.requires_grad else t)
    return out


def _device_of(target: Any) -> torch.device:
    if isinstance(target, torch.nn.Module):
        for t in [*target.parameters(), *target.buffers()]:
            return t.device
    return torch.device("cpu")


# --------------------------------------------------------------- validation
def _validation_problem(
    runner: TraceRunner, module: _Traceable, examples: list[torch.Tensor]
) -> str | None:
    """Why the trace disagrees with eager on ``examples``, or ``None`` if it agrees."""
    with torch.no_grad():
        try:
            torch.manual_seed(0)
            got = runner.run_flat(examples)
        except Exception as e:
            return f"the traced program raised {_first_line(e)}"
        torch.manual_seed(0)
        want = module._bound.call_target(*examples)
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = _tensor_outputs(want, module._qualname)
    if got_spec != want_spec:
        return f"its output structure differs: traced {got_spec}, eager {want_spec}"
    try:
        torch.testing.assert_close(got_leaves, want_leaves)
    except AssertionError as e:
        return "its outputs differ from the eager model's: " + " ".join(str(e).split())[:300]
    return None


def _not_traceable_message(
    why: str,
    first: Mapping[str, int],
    second: Mapping[str, int],
    problem: str,
    tracer: list[warnings.WarningMessage],
) -> str:
    lines = [
        f"backend='jit': {why}, and its torch.jit.trace does not generalize over the "
        f"dynamic lengths: traced with {_lengths_text(first)}, then run with "
        f"{_lengths_text(second)}, {problem}."
    ]
    if tracer:
        lines.append("  The tracer warned that it baked in Python values:")
        for w in tracer:
            message = str(w.message).split(". ")[0]
            lines.append(f"    {w.filename}:{w.lineno}: {message}")
    lines.append(
        "  Use backend='export' (it keeps lengths symbolic, or names the line that fixes "
        "one), or describe those lengths statically."
    )
    return "\n".join(lines)


def _lengths_text(lengths: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in lengths.items()) or "no dynamic lengths"


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if lines[0].startswith("The following operation failed in the TorchScript interpreter"):
        return lines[-1].strip()  # the interpreter's last line is the original error
    return f"{type(error).__name__}: {lines[0].strip()}"


def _type_names(data: Any) -> Iterator[str]:
    if isinstance(data, dict):
        if isinstance(data.get("type"), str):
            yield data["type"]
        for child in data.get("children_spec", []):
            yield from _type_names(child)
    elif isinstance(data, list):
        for item in data:
            yield from _type_names(item)
