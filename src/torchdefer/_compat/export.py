"""The private torch APIs the descriptors use: torch.export's serializer, ShapeEnv, dynamo.

Part of the project's one compat package (``torchdefer._compat``), kept apart
from the core's bindings because only ``torchdefer.descriptors`` imports it
and it pulls in sympy and the export machinery.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.utils._sympy.functions as sympy_functions
from torch._guards import TracingContext, tracing
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._sympy.interp import sympy_interp
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.reference import PythonReferenceAnalysis
from torch.utils._sympy.symbol import prefix_str

from torchdefer.fake._source import is_library_code

__all__ = ["FakeTensor", "deserialize", "evaluate", "example_mode",
           "export_tracing", "fake_mode", "int_oo", "is_constraint_violation", "jit_fold",
           "jit_function", "prefix_str", "reparametrize", "serialize", "symbol_sources",
           "sympy_functions"]

class _ShapeEnv(ShapeEnv):
    """A ShapeEnv whose guard records point at the model's line, not torch's.

    ``ShapeEnv`` stamps each guard with the first frame outside a short list of
    its own files, which is often a torch decomposition (``infer_size``).
    """

    def _get_user_frame(self) -> Any:
        frame = inspect.currentframe()
        while frame is not None and is_library_code(frame.f_code):
            frame = frame.f_back
        return frame


def fake_mode() -> FakeTensorMode:
    """A fresh fake mode for example inputs and weights (no storage at all)."""
    return FakeTensorMode(allow_non_fake_inputs=True)


def example_mode() -> Any:
    """Where the example inputs handed to export inside :func:`export_tracing` are made.

    Fake (no storage) where export fakes again the fake inputs of another
    mode (torch 2.8, 2.12 and later); where it asserts that they share the
    tracing context's mode (2.10), real, empty and never read: export fakes
    them with symbolic sizes.
    """
    return fake_mode() if _takes_foreign_fakes() else nullcontext()


@functools.cache
def _takes_foreign_fakes() -> bool:
    from torch._guards import detect_fake_mode

    with fake_mode():
        foreign = torch.empty(1, device="cpu")
    with tracing(TracingContext(FakeTensorMode())):
        try:
            detect_fake_mode([foreign])
        except AssertionError:
            return False
    return True


@contextmanager
def export_tracing() -> Iterator[FakeTensorMode]:
    """Run ``torch.export.export`` inside with a fake mode (and its ShapeEnv) we keep.

    Non-strict export makes its own fake mode unless a ``TracingContext`` holds
    one (the path dynamo uses); giving it ours lets us read the guard records
    and symbol sources also when export fails. Fake weights must be made in
    this mode (torch 2.10 asserts that every fake input shares it).
    """
    mode = FakeTensorMode(shape_env=_ShapeEnv(tracked_fakes=[], trace_asserts=True),
                          allow_non_fake_inputs=True, export=True)
    with tracing(TracingContext(mode)):
        yield mode


def symbol_sources(shape_env: ShapeEnv) -> dict[Any, tuple[str, int | None]]:
    """Export symbol -> (input name, dim) for sizes, (input name, None) for ints."""
    from torch._dynamo.source import LocalSource, TensorProperty, TensorPropertySource

    out: dict[Any, tuple[str, int | None]] = {}
    for symbol, sources in shape_env.var_to_sources.items():
        for s in sources:
            if isinstance(s, TensorPropertySource) and s.prop is TensorProperty.SIZE:
                if isinstance(s.base, LocalSource):
                    out.setdefault(symbol, (s.base.local_name, s.idx))
            elif isinstance(s, LocalSource):
                out.setdefault(symbol, (s.local_name, None))
    return out


def evaluate(expr: Any, values: Mapping[Any, int]) -> Any:
    """``expr`` with Python's int semantics for ``values``; ``None`` where it cannot."""
    try:
        return sympy_interp(PythonReferenceAnalysis, values, expr)
    except Exception:
        return None


def is_constraint_violation(error: Exception) -> bool:
    """Whether export failed because the code contradicts a ``Dim``."""
    from torch._dynamo.exc import UserError, UserErrorType

    return isinstance(error, UserError) and error.error_type is UserErrorType.CONSTRAINT_VIOLATION


def reparametrize(module: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> Any:
    """Context manager: ``module`` reads ``state`` instead of its own weights."""
    from torch.nn.utils.stateless import _reparametrize_module

    return _reparametrize_module(module, dict(state))


def serialize(program: torch.export.ExportedProgram, twin: Callable[[Any], Any]) -> bytes:
    """The program's graph as torch.export's JSON, written against ``twin``s
    (meta tensors) of its weights and constants: the verifier wants each
    present, and fake ones cannot be written; the real ones are saved apart."""
    def twins(tensors: Mapping[str, Any]) -> dict[str, Any]:
        return {k: torch.nn.Parameter(twin(v), v.requires_grad) if isinstance(v, torch.nn.Parameter)
                else twin(v) if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}

    from torch._export.serde import serialize as serde  # imports torch._dynamo: not at import

    old = program._state_dict, program._constants, program._example_inputs
    program._state_dict, program._constants = twins(old[0]), twins(old[1])
    program._example_inputs = None
    try:
        # The weights are meta twins here: pickling them along (torch < 2.12 has
        # no serialize_state_dict=False) costs nothing, and only the graph is kept.
        return serde.serialize(program).exported_program
    finally:
        program._state_dict, program._constants, program._example_inputs = old


def deserialize(graph: bytes, state: dict[str, torch.Tensor],
                constants: dict[str, torch.Tensor]) -> torch.export.ExportedProgram:
    """Inverse of :func:`serialize`, given weights already read as tensors (dicts,
    not bytes, keep torch away from its ``torch.load(weights_only=False)`` fallback)."""
    from torch._export.serde import serialize as serde

    return serde.deserialize(serde.SerializedArtifact(graph, state, constants, b""))


def jit_function(graph: torch._C.Graph) -> Callable[..., Any]:
    """A callable TorchScript function running ``graph`` (first input ``self``)."""
    return torch._C._create_function_from_graph("forward", graph)


def jit_fold(graph: torch._C.Graph) -> None:
    """Constant-propagate and delete dead code: value-decided branches vanish."""
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_dce(graph)
