"""``Program`` and ``script``: a model specialized to its input descriptors.

A program checks every call against the descriptors (:class:`Checker`), then
runs the specialized graph of its backend:

* ``backend="export"`` (default): ``torch.export``, see ``export_backend``.
* ``backend="jit"``: TorchScript with refined input types and the
  value-specialized arguments constant-folded, see ``jit_backend``; when
  ``torch.jit.script`` cannot compile the model, a ``torch.jit.trace``
  validated at ``script()`` time on a second set of lengths, see ``jit_trace``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import torch

from torchdefer.descriptors.specialization import Specialization
from torchdefer.descriptors.tree import Node

__all__ = ["Backend", "Program", "script"]

Backend = Literal["export", "jit"]


class Runner(Protocol):
    """What a backend provides: a readable graph and a way to run it."""

    @property
    def graph(self) -> str: ...

    def run(self, flat: list[Any], weights: Mapping[str, torch.Tensor] | None) -> Any: ...


class Program:
    """A callable specialized to input descriptors; checks every call.

    Built by :func:`script` or :func:`~torchdefer.load`; not constructed directly.

    Attributes:
        backend: ``"export"`` or ``"jit"``.
        input_descriptors: the descriptors given to :func:`script`, normalized.
        output_descriptors: descriptors of the outputs, nested like them,
            symbolic lengths named after the inputs' (``["b", 10]``).
    """

    def __init__(
        self,
        *,
        backend: Backend,
        spec: Specialization,
        runner: Runner,
        output_descriptors: Any,
        module: torch.nn.Module | None,
        weights: Mapping[str, torch.Tensor] | None = None,
        weightless: bool = False,
    ) -> None:
        self.backend = backend
        self._spec = spec
        self._runner = runner
        self.output_descriptors = output_descriptors
        self._module = module
        self._weights = weights
        # Loaded from a save of a deferred model: the graph's own weights are
        # meta tensors, so running it needs with_weights() first.
        self._weightless = weightless and module is None and weights is None

    @property
    def input_descriptors(self) -> dict[str, Node]:
        return self._spec.user_descriptors

    @property
    def graph(self) -> str:
        """The specialized graph as readable text (value branches are gone)."""
        return self._runner.graph

    @property
    def module(self) -> torch.nn.Module | None:
        """The module whose live weights the program runs with, if any."""
        return self._module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        full = self._spec.check(args, kwargs)
        return self._runner.run(self._flat_inputs(full), self._current_weights())

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
        module = source if isinstance(source, torch.nn.Module) else None
        weights = None if module is not None else dict(source)
        return Program(
            backend=self.backend,
            spec=self._spec,
            runner=self._runner,
            output_descriptors=self.output_descriptors,
            module=module,
            weights=weights,
        )

    def _flat_inputs(self, full: dict[str, Any]) -> Any:
        if self.backend == "jit":
            return full
        return self._spec.flatten(full)

    def _current_weights(self) -> dict[str, torch.Tensor] | None:
        if self._module is not None:
            named = [
                *self._module.named_parameters(remove_duplicate=False),
                *self._module.named_buffers(remove_duplicate=False),
            ]
            weights = dict(named)
        elif self._weights is not None:
            weights = dict(self._weights)
        elif self._weightless:
            raise RuntimeError(
                f"{self._spec.signature.qualname} program was saved from a deferred model, "
                "without weights; bind them with program.with_weights(materialized_module)"
            )
        else:
            return None
        _require_real(weights, self._spec.signature.qualname)
        return weights

    def _current_weights_or_none(self) -> dict[str, torch.Tensor] | None:
        """The live weights if they all hold data, else ``None`` (for save)."""
        try:
            return self._current_weights()
        except RuntimeError:
            return None

    def __repr__(self) -> str:
        inputs = ", ".join(f"{k}={v!r}" for k, v in self.input_descriptors.items())
        return f"Program[{self.backend}]({self._spec.signature.qualname}: {inputs})"


def script(
    model_or_fn: torch.nn.Module | Callable[..., Any],
    input_descriptors: Mapping[str, Any],
    *,
    backend: Backend = "export",
) -> Program:
    """Specialize a module or function to descriptions of its inputs.

    Args:
        model_or_fn: an ``nn.Module`` (its ``forward`` is specialized; the
            program runs with the module's live weights) or a function.
        input_descriptors: parameter name -> :class:`MetaTensorType`, a plain
            value (value specialization: ``flag=True``), a type (``int``), or
            a tuple / list / dict of these shaped like the argument.
            Undescribed parameters are fixed to their defaults.
        backend: ``"export"`` (torch.export) or ``"jit"`` (TorchScript:
            ``torch.jit.script``, or when that fails a ``torch.jit.trace``
            checked against the eager model on lengths it was not traced with).

    Returns:
        A :class:`Program` that checks each call, then runs the specialized graph.

    Raises:
        DescriptorConflict: the model's code contradicts a descriptor.
        TypeError: a descriptor does not fit the signature or the backend, or
            (jit) the model can neither be scripted nor traced faithfully.

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
        raise TypeError(
            f"script() takes an nn.Module or a function, got {type(model_or_fn).__name__}"
        )
    spec = Specialization.build(fn, input_descriptors)
    if backend == "export":
        from torchdefer.descriptors.export_backend import build_export, complete_for_export

        spec = complete_for_export(spec, _module_device(module))
        runner, outputs = build_export(model_or_fn, spec)
    else:
        from torchdefer.descriptors.jit_backend import build_jit

        runner, outputs = build_jit(model_or_fn, spec)
    return Program(
        backend=backend, spec=spec, runner=runner, output_descriptors=outputs, module=module
    )


def _module_device(module: torch.nn.Module | None) -> torch.device:
    if module is not None:
        for t in [*module.parameters(), *module.buffers()]:
            return t.device
    return torch.device("cpu")


def _require_real(weights: Mapping[str, torch.Tensor], qualname: str) -> None:
    for name, t in weights.items():
        if t.is_meta or _is_deferred_tensor(t):
            raise RuntimeError(
                f"{qualname} program: weight {name!r} has no data (it is "
                f"{'a meta tensor' if t.is_meta else 'deferred'}); call "
                "torchdefer.materialize_module(model) first, or bind real weights with "
                "program.with_weights(module_or_state_dict)"
            )


def _is_deferred_tensor(t: torch.Tensor) -> bool:
    if type(t) in (torch.Tensor, torch.nn.Parameter):
        return False
    try:
        from torchdefer.fake import is_fake
    except ImportError:
        return False
    return bool(is_fake(t))
