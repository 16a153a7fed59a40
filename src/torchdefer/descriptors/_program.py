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
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch

from torchdefer.descriptors import _export_backend as export_backend
from torchdefer.descriptors import _jit_backend as jit_backend
from torchdefer.descriptors._checker import (
    Checker,
    concrete_trees,
    concretize,
    merge_ranges,
    show_key,
)
from torchdefer.descriptors._meta_tensor_type import DimRange
from torchdefer.descriptors._tree import Node, Param, parameters, tensors
from torchdefer.descriptors._weights import Weights
from torchdefer.errors import InternalError, MissingGraph, UsageError, UsageTypeError

__all__ = ["Backend", "Program", "script"]

Backend = Literal["export", "jit"]


class Program:
    """A callable specialized to input descriptors; checks every call.

    Built by :func:`script` or :func:`~torchdefer.load_program`; not constructed directly.

    Attributes:
        backend: ``"export"`` or ``"jit"``.
        input_descriptors: the descriptors given to :func:`script`, normalized.
        output_descriptors: descriptors of the outputs, nested like them,
            symbolic lengths named after the inputs' (``["b", 10]``); objects
            of classes other than Python's and torch's containers are
            :class:`~torchdefer.descriptors.ObjectOf` (never built from
            descriptors); ``None`` while no graph has been built yet.
    """

    def __init__(self, *, backend: Backend, qualname: str, params: tuple[Param, ...],
                 ranges: Mapping[str, DimRange], runners: Mapping[tuple, Any], weights: Weights,
                 target: Callable[..., Any] | None = None, output_descriptors: Any = None,
                 method: bool = False, variadic: bool = False) -> None:
        self.backend, self.qualname, self.output_descriptors = backend, qualname, output_descriptors
        self._params, self._ranges, self._weights = params, dict(ranges), weights
        self._check = Checker(qualname, params, ranges, specialize=backend == "export",
                              method=method, variadic=variadic)
        self._variants = dict(runners)  # (facts, fixed symbols) -> runner
        self._target = target  # what export traces for a new case (None: loaded, or jit)
        self._unbuilt: str | None = None  # why script() built no graph, for save_program()
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
                raise InternalError(f"{self.qualname}: the graph built for {fixed} does not cover "
                                    "the call it was built for; please report this")
            fixed.update(missing)

    def _add(self, facts: tuple, fixed: dict, sizes: dict | None = None) -> Any:
        """Build the graph for one case and keep it."""
        if self._target is None:
            case = ", ".join(f"{show_key(k)}={v}" for k, v in fixed.items()) or "general sizes"
            if facts:
                case += f"; inputs {', '.join(map(str, facts))}"
            raise MissingGraph(
                f"{self.qualname} program was loaded from a file that has no graph for this call "
                f"({case}): each export graph covers the sizes and values it was traced for "
                "(symbolic sizes >= 2 and its guards), and a loaded program cannot trace the "
                "model; script it again, or call the scripted program with such inputs once "
                "before save_program() so the file holds it")
        concrete = concrete_trees(self._params, facts, fixed)
        runner = export_backend.build(self._target, self._params, concrete, self._ranges,
                                      self._weights, self.qualname, sizes or {})
        self._variants[(facts, _frozen(fixed))] = runner
        if self.output_descriptors is None:
            self.output_descriptors = runner.output_descriptors(self._ranges)
        return runner

    def _build_at_script(self, module: torch.nn.Module | None,
                         dtypes: Sequence[torch.dtype]) -> None:
        """Build the cases the descriptors leave only a dtype, device or layout
        open for: each of ``dtypes``, and the default dtype's. Conflicts
        surface now; a program saved before any call holds these graphs.

        A failure for a listed dtype, or with every dtype described, raises;
        for the default dtype of an open one it is kept for :meth:`_saveable`
        (the inputs may well be ``int64`` ids)."""
        fixed = {name: self._ranges[name][0] for name in self._pinned}
        default = torch.get_default_dtype()
        for dtype in dict.fromkeys([*dtypes, default]):
            facts = _default_facts(self._params, module, dtype)
            if facts is None:
                if dtypes:
                    raise UsageTypeError(
                        f"script(..., dtypes={list(dtypes)}): the descriptors of {self.qualname} "
                        f"also leave {_blocking(self._params)} open, so no case can be "
                        "built before a call; describe them, or call the program once per case")
                return
            if (facts, _frozen(fixed)) in self._variants:
                continue
            try:
                self._add(facts, fixed)
            except Exception as e:
                if dtype in dtypes or "dtype" not in _open(self._params):
                    raise
                self._unbuilt = f"building it for the default dtype {dtype} failed: {e}"

    def _saveable(self) -> None:
        """Raise :class:`MissingGraph` for an export program that holds no graph:
        a file of it could run nothing, as a loaded program cannot trace."""
        if self.backend != "export" or self._variants:
            return
        why = self._unbuilt or (
            f"its descriptors leave {_blocking(self._params)} open")
        raise MissingGraph(
            f"save_program(): the {self.qualname} program holds no graph yet ({why}), so the file "
            "could run no call. Call the program once with each kind of input you will run (each "
            "call builds its case) before save_program(), or script it with the dtypes to build: "
            "script(..., dtypes=[torch.float32, ...]), or describe what is open")

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

        Use it after :func:`~torchdefer.load_program` of a program saved without
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
            raise UsageTypeError("with_weights() rebinds export programs; a jit program runs with "
                                 "the weights it was scripted (or saved) with")
        new = copy.copy(self)
        if isinstance(source, torch.nn.Module):
            new._weights = Weights(module=source, tensors=None)
        else:
            new._weights = Weights(module=None, tensors=dict(source))
        new._variants = {k: r.with_weights(new._weights) for k, r in self._variants.items()}
        return new

    def __repr__(self) -> str:
        inputs = ", ".join(f"{k}={v!r}" for k, v in self.input_descriptors.items())
        return f"Program[{self.backend}]({self.qualname}: {inputs})"


def _frozen(fixed: dict) -> tuple:
    return tuple(sorted(fixed.items(), key=repr))


def script(model_or_fn: torch.nn.Module | Callable[..., object],
           input_descriptors: Mapping[str, object],
           *, backend: Backend = "export", dtypes: Sequence[torch.dtype] = ()) -> Program:
    """Specialize a module or function to descriptions of its inputs.

    Args:
        model_or_fn: an ``nn.Module`` (its ``forward`` is specialized; the
            program runs with the module's live weights) or a function.
        input_descriptors: parameter name -> :class:`MetaTensorType` (any
            property may be ``None``: unknown), a plain value (value
            specialization: ``flag=True``), a type (``int``, ``List[int]``,
            ``Optional[MetaTensorType]``), or a tuple / list / dict of these
            shaped like the argument. Undescribed parameters are fixed to
            their defaults on ``"export"``; on ``"jit"`` they stay generic
            (any value of their type), and unannotated described ones are
            compiled with the types their descriptors give.
        backend: ``"export"`` (``torch.export``, the default) or ``"jit"``
            (TorchScript, which PyTorch is deprecating: ``torch.jit`` warns of
            it from 2.15 on; the model must be scriptable).
        dtypes: ``"export"``, descriptors that leave a tensor's dtype open:
            the dtypes to build graphs for at ``script()`` time (every open
            dtype takes each in turn), besides the default dtype's, which is
            tried too. A graph is otherwise built by the first call of its
            case, and only built graphs go into :func:`~torchdefer.save_program`.

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
        raise UsageError(f"backend must be 'export' or 'jit', got {backend!r}")
    if isinstance(dtypes, torch.dtype) or not all(isinstance(d, torch.dtype) for d in dtypes):
        raise UsageTypeError(f"dtypes must be a list of torch dtypes, got {dtypes!r}")
    module = model_or_fn if isinstance(model_or_fn, torch.nn.Module) else None
    fn = module.forward if module is not None else model_or_fn
    if not callable(fn):
        raise UsageTypeError("script() takes an nn.Module or a function, got "
                             f"{type(model_or_fn).__name__}")
    qualname, params = parameters(fn, input_descriptors)
    ranges = merge_ranges([leaf for p in params for leaf in tensors(p.node)])
    weights = Weights(module=module, tensors=None if module is not None else {})
    runners, outputs = {}, None
    if backend == "jit":
        runner = runners[((), ())] = jit_backend.build(model_or_fn, params, qualname)
        params = runner.params  # undescribed parameters made generic
        # Export names output lengths after the inputs'; the jit graph cannot.
        # It is given the generic descriptors, so no length holds for a default only.
        with contextlib.suppress(Exception):
            outputs = script(model_or_fn, {p.name: p.node for p in params if p.node is not None
                                           }).output_descriptors
    program = Program(backend=backend, qualname=qualname, params=params, ranges=ranges,
                      runners=runners, weights=weights, output_descriptors=outputs,
                      target=model_or_fn if backend == "export" else None,
                      method=inspect.ismethod(fn), variadic=any(
                          p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                          for p in inspect.signature(fn).parameters.values()))
    if backend == "export":
        program._build_at_script(module, dtypes)
    return program


class _Unknown(Exception):
    """A fact the descriptors leave open and no call has told yet."""


def _default_facts(params: tuple[Param, ...], module: torch.nn.Module | None,
                   dtype: torch.dtype) -> tuple | None:
    """The facts of the case built at script time -- unknown dtypes ``dtype``,
    devices the module's (its first weight's, else CPU), layouts strided --
    or ``None`` if the descriptors leave a rank, length or value open (then
    the first call builds its case)."""
    weights = [*module.parameters(), *module.buffers()] if module is not None else []
    known = {"dtype": dtype, "layout": torch.strided,
             "device": weights[0].device if weights else torch.device("cpu")}
    facts: list[Any] = []

    def fact(kind: str) -> Any:
        if kind not in known:
            raise _Unknown(kind)
        facts.append(known[kind])
        return facts[-1]

    try:
        for p in params:
            if p.node is not None:
                concretize(p.node, p.name, fact, {})
    except _Unknown:
        return None
    return tuple(facts)


_OPEN = {"dtype": "a dtype", "device": "a device", "layout": "a layout", "rank": "a rank",
         "len": "a list's length", "none": "whether an Optional is None",
         "value": "a bool, float or str value (described by its type)"}
# Stand-ins that let concretize walk on past each open property.
_STAND_IN = {"dtype": torch.float32, "device": torch.device("cpu"), "layout": torch.strided,
             "rank": 0, "len": 0, "none": True, "value": None}


def _open(params: tuple[Param, ...]) -> list[str]:
    """The kinds of property the descriptors leave open (``_OPEN``'s keys), each once."""
    kinds: dict[str, None] = {}

    def fact(kind: str) -> Any:
        kinds[kind] = None
        return _STAND_IN[kind]

    for p in params:
        if p.node is not None:
            concretize(p.node, p.name, fact, {})
    return list(kinds)


def _blocking(params: tuple[Param, ...]) -> str:
    """In words, what the descriptors leave open that script() cannot default."""
    return ", ".join(_OPEN[k] for k in _open(params) if k not in ("dtype", "device", "layout"))
