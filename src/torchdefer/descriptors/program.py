"""``Program`` and ``script``: a model specialized to its input descriptors.

A program checks every call against the descriptors (``checker.py``), then
runs the graph of a backend runner. A runner is anything with::

    runner(args)       # every parameter's value, in order, defaults applied
    runner.coverage    # the calls it is sound for (export.Coverage)
    runner.graph       # readable text

* ``backend="export"`` (default): ``torch.export``, see ``export_backend``.
  One runner per concrete case: descriptors that leave a dtype, rank, list
  length or ``Optional`` open, and sizes the export did not cover (0/1, a
  guard such as ``n != 1``), get their own graph, built on first use.
* ``backend="jit"``: TorchScript, see ``jit_backend``; one generic runner.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch

from torchdefer.descriptors import export_backend, jit_backend
from torchdefer.descriptors.checker import (
    Checker,
    concrete_trees,
    concretize,
    merge_ranges,
    show_key,
)
from torchdefer.descriptors.meta_tensor_type import DimRange
from torchdefer.descriptors.tree import Node, Param, parameters, tensors
from torchdefer.descriptors.weights import Weights

__all__ = ["Backend", "Program", "script"]

Backend = Literal["export", "jit"]


class Program:
    """A callable specialized to input descriptors; checks every call.

    Built by :func:`script` or :func:`~torchdefer.load`; not constructed directly.

    Attributes:
        backend: ``"export"`` or ``"jit"``.
        input_descriptors: the descriptors given to :func:`script`, normalized.
        output_descriptors: descriptors of the outputs, nested like them,
            symbolic lengths named after the inputs' (``["b", 10]``); ``None``
            while the descriptors leave the dtype or rank open and no call has
            built a graph yet.
    """

    def __init__(self, *, backend: Backend, qualname: str, params: tuple[Param, ...],
                 ranges: Mapping[str, DimRange], runners: Mapping[tuple, Any], weights: Weights,
                 target: Callable[..., Any] | None = None, output_descriptors: Any = None) -> None:
        self.backend, self.qualname, self.output_descriptors = backend, qualname, output_descriptors
        self._params, self._ranges, self._weights = params, dict(ranges), weights
        self._check = Checker(qualname, params, ranges, specialize=backend == "export")
        self._variants = dict(runners)  # (facts, fixed symbols) -> runner
        self._target = target  # what export traces for a new case (None: loaded, or jit)
        # Named sizes whose range lies below 2, where export cannot keep them
        # symbolic: always fixed to the call's value.
        self._pinned = [n for n, (_, hi) in self._ranges.items() if hi is not None and hi < 2]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        values, env, facts = self._check(args, kwargs)
        runner = self._variants.get((facts, ()))  # the general graph (nothing fixed)
        if runner is None or (runner.coverage.keys and runner.coverage.uncovered(env)):
            runner = self._variant(facts, env)
        return runner(values)

    def _variant(self, facts: tuple, env: dict) -> Any:
        """The runner that covers this call, built (and kept) if there is none."""
        # Unnamed sizes and ints below 2 cannot be examples export keeps symbolic.
        fixed = {k: v for k, v in env.items() if not isinstance(k, str) and v < 2}
        fixed.update((name, env[name]) for name in self._pinned)
        while True:
            runner = self._variants.get((facts, _frozen(fixed))) or self._add(facts, fixed, env)
            missing = runner.coverage.uncovered(env)
            if not missing:
                return runner
            if all(fixed.get(k) == v for k, v in missing.items()):
                raise RuntimeError(f"{self.qualname}: a graph built for {fixed} does not cover it")
            fixed.update(missing)

    def _add(self, facts: tuple, fixed: dict, sizes: dict | None = None) -> Any:
        """Build the graph for one case and keep it."""
        if self._target is None:
            case = ", ".join(f"{show_key(k)}={v}" for k, v in fixed.items()) or "general sizes"
            if facts:
                case += f"; inputs {', '.join(map(str, facts))}"
            raise RuntimeError(
                f"{self.qualname} program was loaded from a file that has no graph for this call "
                f"({case}): each export graph covers the sizes and values it was traced for "
                "(symbolic sizes >= 2 and its guards), and a loaded program cannot trace the "
                "model; script it again, or call the scripted program with such inputs once "
                "before save() so the file holds it")
        concrete = concrete_trees(self._params, facts, fixed)
        runner = export_backend.build(self._target, self._params, concrete, self._ranges,
                                      self._weights, self.qualname, sizes or {})
        self._variants[(facts, _frozen(fixed))] = runner
        if self.output_descriptors is None:
            self.output_descriptors = runner.output_descriptors(self._ranges)
        return runner

    @property
    def input_descriptors(self) -> dict[str, Node]:
        return {p.name: p.node for p in self._params if p.described}

    @property
    def graph(self) -> str:
        """The specialized graph as readable text (value branches are gone);
        for export, the first graph built."""
        return next(iter(self._variants.values())).graph if self._variants else ""

    @property
    def variants(self) -> int:
        """How many graphs the program holds (export builds one per case)."""
        return len(self._variants)

    def with_weights(self, source: torch.nn.Module | Mapping[str, torch.Tensor]) -> Program:
        """The same program running with weights from ``source``.

        Use it after :func:`~torchdefer.load` of a program saved without
        weights (from a deferred model): pass the materialized module or its
        ``state_dict()``.

        Example:
            >>> import torch, torchdefer
            >>> from torchdefer.descriptors import MetaTensorType
            >>> m = torch.nn.Linear(3, 2)
            >>> p = torchdefer.script(m, {"input": MetaTensorType(["b", 3], torch.float32)})
            >>> q = p.with_weights(torch.nn.Linear(3, 2).state_dict())
            >>> q(torch.ones(1, 3)).shape
            torch.Size([1, 2])
        """
        if self.backend != "export":
            raise TypeError("with_weights() rebinds export programs; a jit program runs with "
                            "the weights it was scripted (or saved) with")
        module = source if isinstance(source, torch.nn.Module) else None
        new = copy.copy(self)
        new._weights = Weights(module=module, tensors=None if module is not None else dict(source))
        new._variants = {k: r.with_weights(new._weights) for k, r in self._variants.items()}
        return new

    def __repr__(self) -> str:
        inputs = ", ".join(f"{k}={v!r}" for k, v in self.input_descriptors.items())
        return f"Program[{self.backend}]({self.qualname}: {inputs})"


def _frozen(fixed: dict) -> tuple:
    return tuple(sorted(fixed.items(), key=repr))


def script(model_or_fn: torch.nn.Module | Callable[..., Any], input_descriptors: Mapping[str, Any],
           *, backend: Backend = "export") -> Program:
    """Specialize a module or function to descriptions of its inputs.

    Args:
        model_or_fn: an ``nn.Module`` (its ``forward`` is specialized; the
            program runs with the module's live weights) or a function.
        input_descriptors: parameter name -> :class:`MetaTensorType` (any
            property may be ``None``: unknown), a plain value (value
            specialization: ``flag=True``), a type (``int``, ``List[int]``,
            ``Optional[MetaTensorType]``), or a tuple / list / dict of these
            shaped like the argument. Undescribed parameters are fixed to
            their defaults.
        backend: ``"export"`` (``torch.export``, the default) or ``"jit"``
            (TorchScript, which PyTorch is deprecating: ``torch.jit`` warns of
            it from 2.15 on; the model must be scriptable).

    Returns:
        A :class:`Program` that checks each call, then runs the specialized graph.

    Raises:
        DescriptorConflict: the model's code contradicts a descriptor.
        TypeError: a descriptor does not fit the signature or the backend.

    Example:
        >>> import torch, torchdefer
        >>> from torchdefer.descriptors import MetaTensorType
        >>> class M(torch.nn.Module):
        ...     def forward(self, x, flag):
        ...         return x + 1 if flag else x - 1
        >>> p = torchdefer.script(M(), {"x": MetaTensorType(["b", 4], torch.float32), "flag": True})
        >>> p(torch.zeros(2, 4), True).sum().item()
        8.0
        >>> p.output_descriptors
        MetaTensorType(shape=['b', 4], dtype=torch.float32, device='cpu', layout=torch.strided)
    """
    if backend not in ("export", "jit"):
        raise ValueError(f"backend must be 'export' or 'jit', got {backend!r}")
    module = model_or_fn if isinstance(model_or_fn, torch.nn.Module) else None
    fn = module.forward if module is not None else model_or_fn
    if not callable(fn):
        raise TypeError("script() takes an nn.Module or a function, got "
                        f"{type(model_or_fn).__name__}")
    qualname, params = parameters(fn, input_descriptors)
    ranges = merge_ranges([leaf for p in params for leaf in tensors(p.node)])
    weights = Weights(module=module, tensors=None if module is not None else {})
    runners, outputs = {}, None
    if backend == "jit":
        runners[((), ())] = jit_backend.build(model_or_fn, params, qualname)
        # Export names output lengths after the inputs'; the jit graph cannot.
        with contextlib.suppress(Exception):
            outputs = script(model_or_fn, input_descriptors).output_descriptors
    program = Program(backend=backend, qualname=qualname, params=params, ranges=ranges,
                      runners=runners, weights=weights, output_descriptors=outputs,
                      target=model_or_fn if backend == "export" else None)
    facts = _default_facts(params, module) if backend == "export" else None
    if facts is not None:  # build now, so conflicts surface at script() time
        program._add(facts, {name: ranges[name][0] for name in program._pinned})
    return program


class _Unknown(Exception):
    """A fact the descriptors leave open and no call has told yet."""


def _default_facts(params: tuple[Param, ...], module: torch.nn.Module | None) -> tuple | None:
    """The facts of the case built at script time -- unknown devices are the
    module's (its first weight's, else CPU), layouts strided -- or ``None`` if
    the descriptors leave a dtype, rank, length or value open (then the first
    call builds its case)."""
    weights = [*module.parameters(), *module.buffers()] if module is not None else []
    device = weights[0].device if weights else torch.device("cpu")
    facts: list[Any] = []

    def fact(kind: str) -> Any:
        if kind not in ("device", "layout"):
            raise _Unknown(kind)
        facts.append(device if kind == "device" else torch.strided)
        return facts[-1]

    try:
        for p in params:
            if p.node is not None:
                concretize(p.node, p.name, fact, {})
    except _Unknown:
        return None
    return tuple(facts)

