"""What ``load(..., allow_torchscript=True)`` still refuses in a TorchScript archive.

A TorchScript archive is code: ``torch.jit.load`` compiles the Python-syntax
source under ``code/`` and runs any ``__setstate__`` it defines while
loading; the compiled methods may call any operator registered in the
process. ``allow_torchscript=True`` is the user saying they trust the file
as code. Before ``torch.jit.load`` sees the archive, torchdefer still parses
that source (``ast``: the decoded structure, not its text) and refuses:

* a ``__setstate__`` anywhere (it would run inside ``torch.jit.load``);
* a call of an operator that reaches outside its tensors: the export
  allowlist's refusals (``_operators``: ``from_file``, pinned memory, streams,
  ``_print``, the cuFFT cache, storages, ``_test_`` operators) plus the
  TorchScript-only builtins that write files, reseed the process's generator
  or talk over RPC (``_SCRIPT_DENIED``);
* operators of any namespace but ``aten`` and ``prim`` (custom operators,
  collectives), however spelled (``torch.x``, ``ops.ns.x``,
  ``torch.ops.ns.x``), and Tensor methods that are refused operators
  (``x.pin_memory()``).

This is a denylist over code the user chose to trust, not the export path's
allowlist: TorchScript's own builtins (string, list and dict operations,
``print``, grad-mode switches) have no dispatcher entry to check against.
"""

from __future__ import annotations

import ast
import io
import zipfile

from torchdefer.descriptors._operators import ForbiddenOperator, refusal_for_aten

__all__ = ["check_torchscript_code"]

_SCRIPT_DENIED = {
    "save": "writes files", "manual_seed": "reseeds the process's random generator",
    "seed": "reseeds the process's random generator",
    **dict.fromkeys(("rpc_async", "rpc_sync", "rpc_remote", "to_here", "local_value", "owner",
                     "owner_name", "confirmed_by_owner", "is_owner"), "talks to other processes"),
}


def check_torchscript_code(archive: bytes) -> None:
    """Refuse what the TorchScript source inside ``archive`` would run outside its tensors.

    Raises:
        ForbiddenOperator: naming the source file, its line and the call.

    Example:
        >>> import io, torch, zipfile
        >>> buffer = io.BytesIO()
        >>> torch.jit.save(torch.jit.script(torch.nn.ReLU()), buffer)
        >>> check_torchscript_code(buffer.getvalue())  # plain tensor code passes
    """
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        for info in zf.infolist():
            if info.filename.endswith(".py") and "/code/" in f"/{info.filename}":
                source = zf.read(info).decode("utf-8")
                for node in ast.walk(ast.parse(source, info.filename)):
                    reason = _refusal(node)
                    if reason:
                        line = getattr(node, "lineno", "?")  # refused nodes have one
                        raise ForbiddenOperator(f"{info.filename}, line {line}: {reason}; "
                                                "even with allow_torchscript=True, torchdefer "
                                                "loads TorchScript that only computes on tensors")


def _refusal(node: ast.AST) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__setstate__":
        return "defines __setstate__, code torch.jit.load would run while loading"
    if not isinstance(node, ast.Call):
        return None
    path = _dotted(node.func)
    call = ".".join(path)
    if len(path) == 2 and path[0] == "torch":  # an aten builtin, as TorchScript prints it
        namespace, name = "aten", path[1]
    elif len(path) == 3 and path[0] == "ops":  # ops.<namespace>.<name>
        namespace, name = path[1], path[2]
    elif len(path) == 4 and path[:2] == ["torch", "ops"]:  # the same, spelled in full
        namespace, name = path[2], path[3]
    elif isinstance(node.func, ast.Attribute) and refusal_for_aten(node.func.attr):
        # a Tensor method is its aten operator: x.pin_memory(), x.record_stream(s)
        return f"calls {call or node.func.attr}(), which {refusal_for_aten(node.func.attr)}"
    else:
        return None  # other methods, constructors, TorchScript builtins (len, print ...)
    if namespace not in ("aten", "prim"):
        return f"calls {call}, an operator outside aten and prim"
    reason = _SCRIPT_DENIED.get(name) or (refusal_for_aten(name) if namespace == "aten" else None)
    return f"calls {call}, which {reason}" if reason else None


def _dotted(func: ast.AST) -> list[str]:
    """``torch.from_file`` -> ``["torch", "from_file"]``; ``[]`` for anything else."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    return [func.id, *reversed(parts)] if isinstance(func, ast.Name) else []
