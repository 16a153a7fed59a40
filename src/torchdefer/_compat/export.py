"""The private torch APIs the descriptors use: torch.export's serializer, ShapeEnv, dynamo.

Part of the project's one compat package (``torchdefer._compat``), kept apart
from the core's bindings because only ``torchdefer.descriptors`` imports it
and it pulls in sympy and the export machinery.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from types import CodeType
from typing import Any

import torch
import torch.utils._sympy.functions as sympy_functions
from torch._guards import TracingContext, tracing
from torch._ops import HigherOrderOperator, OpOverload
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._sympy.interp import sympy_interp
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.reference import PythonReferenceAnalysis
from torch.utils._sympy.symbol import prefix_str

__all__ = ["FakeTensor", "HigherOrderOperator", "OpOverload", "deserialize",
           "dispatcher_operator_names", "evaluate", "example_mode",
           "export_tracing", "fake_mode", "int_oo", "is_constraint_violation", "jit_fold",
           "jit_function", "jit_script", "prefix_str", "reparametrize", "serialize",
           "spec_children", "symbol_sources", "sympy_functions"]

class _ShapeEnv(ShapeEnv):
    """A ShapeEnv whose guard records point at the model's line, not torch's.

    ``ShapeEnv`` stamps each guard with the first frame outside a short list of
    its own files, which is often a torch decomposition (``infer_size``).
    ``is_library_code`` (the caller's: compat imports nothing of the core) says
    which frames to pass over.
    """

    def __init__(self, is_library_code: Callable[[CodeType], bool], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._is_library_code = is_library_code

    def _get_user_frame(self) -> Any:
        frame = inspect.currentframe()
        while frame is not None and self._is_library_code(frame.f_code):
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
def export_tracing(is_library_code: Callable[[CodeType], bool]) -> Iterator[FakeTensorMode]:
    """Run ``torch.export.export`` inside with a fake mode (and its ShapeEnv) we keep.

    Non-strict export makes its own fake mode unless a ``TracingContext`` holds
    one (the path dynamo uses); giving it ours lets us read the guard records
    and symbol sources also when export fails. Fake weights must be made in
    this mode (torch 2.10 asserts that every fake input shares it).
    """
    shape_env = _ShapeEnv(is_library_code, tracked_fakes=[], trace_asserts=True)
    mode = FakeTensorMode(shape_env=shape_env,
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


def evaluate(expr: Any, values: dict[Any, int]) -> Any:
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

    # Typed as bytes; serde takes the dicts as they are, on purpose (see above).
    artifact = serde.SerializedArtifact(graph, state, constants, b"")  # type: ignore[arg-type]
    return serde.deserialize(artifact)


def dispatcher_operator_names() -> frozenset[str]:
    """``aten::add.Tensor``-style names of every operator registered with the
    dispatcher (TorchScript-only builtins like ``aten::save`` are not)."""
    return frozenset(torch._C._dispatch_get_all_op_names())


def jit_function(graph: torch._C.Graph) -> Callable[..., Any]:
    """A callable TorchScript function running ``graph`` (first input ``self``)."""
    return torch._C._create_function_from_graph("forward", graph)


def jit_fold(graph: torch._C.Graph) -> None:
    """Constant-propagate and delete dead code: value-decided branches vanish."""
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_dce(graph)


def spec_children(spec: Any) -> list[Any]:
    """A pytree ``TreeSpec``'s child specs: ``children()`` where torch has it
    (2.13 deprecates ``children_specs``, which older releases only have)."""
    children = getattr(type(spec), "children", None)
    return spec.children() if callable(children) else list(spec.children_specs)


# TorchScript keeps one graph per function (its cache) and per module class
# (shared types), so a function scripted with other annotations gets a name
# of its own: the number makes it unique in the process.
_specialized = itertools.count()


def jit_script(target: Any, annotations: Mapping[str, str]) -> Any:
    """``torch.jit.script(target)``, the unannotated parameters named in
    ``annotations`` (of the function, or of a module's ``forward``) typed by
    them (TorchScript type text, ``"Tuple[Tensor, int]"``).

    TorchScript reads types only from the source: the definition is built
    from the parsed source with the annotations added; a function is
    compiled under a name of its own, a module with its types unshared.
    """
    if not annotations:
        return torch.jit.script(target)
    from torch import _jit_internal
    from torch.jit import _recursive, _script, frontend

    if not isinstance(target, torch.nn.Module):
        rcb = _jit_internal.createResolutionCallbackFromClosure(target)
        name = f"__torch__.torchdefer_specialized{next(_specialized)}.{target.__name__}"
        return torch._C._jit_script_compile(name, _annotated_def(target, annotations), rcb,
                                            frontend.get_default_args(target))
    root = _script.call_prepare_scriptable_func(target)
    forward = type(root).forward

    def stubs(module: torch.nn.Module) -> list[Any]:
        found = _recursive.infer_methods_to_compile(module)
        if module is not root:
            return found
        return [_recursive.ScriptMethodStub(
                    s.resolution_callback,
                    _annotated_def(forward, annotations, "RecursiveScriptModule"),
                    s.original_method)
                if getattr(s.original_method, "__name__", None) == "forward" else s
                for s in found]

    return _recursive.create_script_module(root, stubs, share_types=False)


def _annotated_def(fn: Callable[..., Any], annotations: Mapping[str, str],
                   self_name: str | None = None) -> Any:
    """TorchScript's definition of ``fn`` with ``annotations`` on its
    unannotated parameters, placed at each parameter in the source."""
    from torch.jit import frontend

    parsed = frontend.parse_def(fn)
    node = parsed.ast.body[0]
    for arg in [*node.args.args, *node.args.kwonlyargs]:
        if arg.arg in annotations and arg.annotation is None:
            expr = ast.parse(annotations[arg.arg], mode="eval").body
            for part in ast.walk(expr):  # messages point at the parameter
                vars(part).update(  # every node, expression contexts too (no fields typed)
                    lineno=arg.lineno, col_offset=arg.col_offset,
                    end_lineno=arg.end_lineno, end_col_offset=arg.end_col_offset,
                )
            arg.annotation = expr
    type_line = torch.jit.annotations.get_type_line(parsed.source)
    return frontend.build_def(parsed.ctx, node, type_line, fn.__name__, self_name=self_name)
