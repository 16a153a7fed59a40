"""``save`` / ``load``: programs on disk, with descriptors, checks and every graph built.

The file is a zip archive:

* ``torchdefer.json`` -- format version, backend, the parameters with their
  descriptor trees, ranges, and per export graph its case (facts, fixed
  sizes), coverage and output recipe;
* export: ``graph<i>.json`` (``torch.export``'s JSON graph format),
  ``graph<i>.constants.pt``, and one ``weights.pt`` shared by the graphs;
* jit: ``program.ts`` (a ``torch.jit.save`` archive).

**Loading never runs code from the file.** Descriptors and cases are JSON
read into descriptor objects; containers are rebuilt only from types
registered with ``torch.utils._pytree`` in the loading process, and every
pytree spec (ours, or export's ``in_spec``/``out_spec``) is checked decoded
and handed to torch's reader as the text written back from what was checked
(``_expr.checked_treespec``); tensors are read with
``torch.load(weights_only=True)``; every symbolic expression in the graph
JSON is checked by the restricted parser of ``_expr`` *before* torch's
deserializer (which would ``sympify``, i.e. evaluate, it) sees it; the
``guards_code`` that ``ExportedProgram.module()`` would ``exec`` must be
empty. **A loaded graph runs tensor math only**: every node's operator is
checked against an allowlist (``_operators``) on the decoded JSON, before
torch resolves a name in it, and again on the graph module torch builds;
``aten.from_file``, custom namespaces and code-running higher-order
operators are refused. ``torch.export.load`` is not used: it falls back to
``weights_only=False`` for payloads that are not plain tensors, and runs any
registered operator. **Sizes are bounded**: every zip header (the file's and
those of the archives inside it) is checked against the archive before a
byte is read, compressed members are bounded (``_zip``), and each member
must be as large as ``torchdefer.json`` declares. A TorchScript archive
contains code that runs when it is loaded, so jit programs load only with
``allow_torchscript=True`` (see :func:`load_program` for what that trusts). Damaged
or refused files raise :class:`ProgramFileError` naming the file and the
part.

A program of a deferred (or meta) model is saved with meta-tensor weights:
nothing of the model's size is written or allocated on load; bind real
weights with :meth:`Program.with_weights`.
"""

from __future__ import annotations

import io
import json
import os
import stat
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from torchdefer._compat import export as compat
from torchdefer.descriptors._checker import concrete_trees
from torchdefer.descriptors._export_backend import Coverage, ExportRunner
from torchdefer.descriptors._expr import UnsafeExpression, checked_treespec, parse
from torchdefer.descriptors._jit_backend import JitRunner
from torchdefer.descriptors._meta_tensor_type import MetaTensorType
from torchdefer.descriptors._operators import (
    ForbiddenOperator,
    check_graph_json,
    check_graph_module,
)
from torchdefer.descriptors._outputs import OutputRecipe
from torchdefer.descriptors._program import Program
from torchdefer.descriptors._torchscript import check_torchscript_code
from torchdefer.descriptors._tree import Param, from_json, to_json
from torchdefer.descriptors._weights import Weights, has_data
from torchdefer.descriptors._zip import checked_members, checked_size, nested_members
from torchdefer.errors import ProgramFileError, UsageError, UsageTypeError
from torchdefer.fake._layout import meta_twin

__all__ = ["load", "load_program", "save", "save_program"]

_FORMAT = "torchdefer.program"
_VERSION = 3


def save_program(program: Program, path: str | os.PathLike[str]) -> None:
    """Write ``program`` to ``path``; :func:`load_program` reads it back, checks included.

    Every graph the program has built so far is written (an export program
    builds one per dtype, list length, 0/1 size ... on first use), so a loaded
    program runs exactly the calls those graphs cover. Weights of the
    program's module are stored when they are real tensors; when the module
    is deferred (or on the meta device) only their metadata is.

    Example:
        >>> import torch, torchdefer, tempfile, os
        >>> from torchdefer.descriptors import MetaTensorType
        >>> x = MetaTensorType(["b", 3], torch.float32)
        >>> p = torchdefer.script(torch.nn.Linear(3, 2), {"input": x})
        >>> f = os.path.join(tempfile.mkdtemp(), "linear.tdp")
        >>> torchdefer.save_program(p, f)
        >>> torchdefer.load_program(f)(torch.ones(4, 3)).shape
        torch.Size([4, 2])
    """
    if not isinstance(program, Program):
        raise UsageTypeError("save_program() takes a program from torchdefer.script(), got "
                             f"{type(program).__name__}")
    program._saveable()  # a file without a graph could run nothing
    header: dict[str, Any] = {
        "format": _FORMAT, "version": _VERSION, "backend": program.backend,
        "qualname": program.qualname, "params": to_json(program._params),
        "method": program._check.method,  # a module's forward: messages count its self
        "variadic": program._check.variadic,
        "ranges": [[n, lo, hi] for n, (lo, hi) in program._ranges.items()],
    }
    files: dict[str, bytes] = {}
    if program.backend == "jit":
        scripted = next(iter(program._variants.values())).scripted
        files["program.ts"] = _bytes(torch.jit.save, scripted)
        try:  # say it now rather than write a file load_program() refuses
            check_torchscript_code(files["program.ts"])
        except ForbiddenOperator as e:
            raise UsageTypeError(
                f"save_program(): the TorchScript of {program.qualname}: {e}; "
                "load_program() would refuse the file, so it is not written") from None
        try:  # descriptors of what TorchScript returns are plain trees
            header["outputs"] = to_json(program.output_descriptors)
        except TypeError:
            header["outputs"] = None
    else:
        header["variants"], header["weights"] = _export_files(program, files)
    header["members"] = {n: len(data) for n, data in files.items()}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("torchdefer.json", json.dumps(header, indent=1))
        for name, data in files.items():
            zf.writestr(name, data)


def load_program(path: str | os.PathLike[str], *, allow_torchscript: bool = False) -> Program:
    """Read a program written by :func:`save_program`; it checks and runs as before.

    Args:
        path: the file.
        allow_torchscript: load a jit program. Its TorchScript archive is code:
            ``torch.jit.load`` compiles it and the program runs it, so this
            trusts the file as code. torchdefer still checks everything else
            in the file as for an export program, and refuses TorchScript
            that defines ``__setstate__`` (run while loading) or calls an
            operator that reaches files, pinned memory, streams, RPC, the
            process's seed or a custom namespace (``_torchscript``); it does
            not refuse other TorchScript builtins (``print``, grad-mode
            switches, string and list operations). Only for files you trust.

    Returns:
        The program; bind weights with :meth:`Program.with_weights` if it was
        saved without (from a deferred model).

    Raises:
        ProgramFileError: the file is damaged or incomplete, not a torchdefer
            program, not a regular file, or holds something loading would
            have to execute or a graph calling more than tensor operators.
        OSError: the path cannot be opened (``FileNotFoundError`` ...).

    Example:
        >>> import torch, torchdefer, tempfile, os
        >>> from torchdefer.descriptors import MetaTensorType
        >>> p = torchdefer.script(lambda x: x * 2, {"x": MetaTensorType(["n"], torch.float32)})
        >>> f = os.path.join(tempfile.mkdtemp(), "double.tdp")
        >>> torchdefer.save_program(p, f)
        >>> loaded = torchdefer.load_program(f)
        >>> loaded(torch.arange(3.0)).tolist()
        [0.0, 2.0, 4.0]
        >>> loaded(torch.arange(3))  # still checked: an int64 tensor is refused
        Traceback (most recent call last):
        ...
        torchdefer.errors.DescriptorMismatch: x.dtype: expected torch.float32, ...
    """
    name = os.fspath(path)
    members = _read(name)
    header = _json(members, "torchdefer.json", name) if "torchdefer.json" in members else None
    if not isinstance(header, dict) or header.get("format") != _FORMAT:
        raise ProgramFileError(f"{name!r} is not a torchdefer program (no torchdefer.json header); "
                               "torchdefer.load_program reads files written by "
                               "torchdefer.save_program")
    if header.get("version") != _VERSION:
        raise ProgramFileError(f"{name!r}: unsupported version {header.get('version')!r}; this "
                               f"torchdefer reads {_FORMAT} version {_VERSION}")
    backend = header.get("backend")
    if backend == "jit" and not allow_torchscript:
        raise ProgramFileError(
            f"{name!r} holds a TorchScript program (backend='jit'): loading it runs the "
            "TorchScript code inside the file, so it is refused by default; pass "
            "allow_torchscript=True if you trust where the file comes from, or save a "
            "program built with backend='export'")
    with _reading(name, "torchdefer.json"):
        qualname, params = header["qualname"], from_json(header["params"])
        ranges = {n: (lo, hi) for n, lo, hi in header["ranges"]}
        MetaTensorType(dim_ranges=ranges)  # checks them
        if backend not in ("export", "jit") or not all(isinstance(p, Param) for p in params):
            raise UsageError(f"backend {backend!r} or parameters {params!r}")
        variants = list(header["variants"]) if backend == "export" else []
        outputs = header.get("outputs") and from_json(header["outputs"])
    if backend == "jit":
        with _reading(name, "program.ts"):
            nested_members(_member(members, "program.ts", name), name, "program.ts")
            check_torchscript_code(members["program.ts"])  # before torch.jit.load runs any
            data = io.BytesIO(members["program.ts"])
            runners: Mapping[tuple[Any, ...], JitRunner | ExportRunner] = {
                ((), ()): JitRunner(torch.jit.load(data, map_location="cpu"), params, qualname)
            }
        weights = Weights()
    else:
        weights, runners = _export_runners(header, variants, members, params, qualname, name)
    with _reading(name, "torchdefer.json"):
        first = next(iter(runners.values()), None)
        if backend == "export":  # its runners are ExportRunners
            outputs = first.output_descriptors(ranges) if isinstance(first, ExportRunner) else None
        return Program(backend=backend, qualname=qualname, params=params, ranges=ranges,
                       runners=runners, weights=weights, output_descriptors=outputs,
                       method=header.get("method") is True,
                       variadic=header.get("variadic") is True)


def _export_runners(header: dict[str, Any], variants: list[Any], members: dict[str, bytes],
                    params: tuple[Param, ...], qualname: str,
                    name: str) -> tuple[Weights, dict[tuple, ExportRunner]]:
    state = _tensors(members, "weights.pt", name)
    weights = Weights(tensors=state) if header.get("weights") else Weights(
        missing=f"{qualname} program was saved from a deferred model, without weights; bind them "
        "with program.with_weights(materialized_module)")
    runners = {}
    for i, v in enumerate(variants):
        with _reading(name, f"graph {i} of torchdefer.json"):
            facts, fixed = case = from_json(v["case"])
            hash(case)  # a key of the program's graphs
            concrete = concrete_trees(params, facts, dict(fixed))
            coverage = Coverage.from_json(v["coverage"])
            recipe = OutputRecipe.from_json(v["recipe"])
        member = f"graph{i}.json"
        graph = _json(members, member, name)
        constants = _tensors(members, f"graph{i}.constants.pt", name)
        with _reading(name, member):
            if not isinstance(graph, dict):
                raise UsageError("not a JSON object")
            if graph.get("guards_code"):
                raise UnsafeExpression("it carries guards_code, Python source torch would exec")
            check_graph_json(graph)  # before torch resolves any name in it
            _check_texts(graph)
            # Non-persistent buffers are constants to torch; the runner reads them from weights.
            persistent = {n: t for n, t in state.items() if n not in constants}
            # torch reads the document as checked above, written again: never the file's text.
            ep = compat.deserialize(json.dumps(graph).encode(), persistent, constants)
            check_graph_module(ep.graph_module)
        runners[case] = ExportRunner(ep, params, concrete, recipe, coverage, weights, qualname,
                                     v.get("training"))
    return weights, runners


def _export_files(program: Program, files: dict[str, bytes]) -> tuple[list[dict[str, Any]], bool]:
    weights: dict[str, torch.Tensor] = {}
    variants = []
    for i, (case, runner) in enumerate(program._variants.items()):
        ep = runner.program
        try:  # say it now rather than write a file load_program() refuses
            check_graph_module(ep.graph_module)
        except ForbiddenOperator as e:
            raise UsageTypeError(
                f"save_program(): graph {i} of {program.qualname}: {e}; "
                "load_program() would refuse the file, so it is not written") from None
        try:
            live = dict(zip(runner.held, runner.resolve()))
        except RuntimeError:  # deferred or unbound: store metadata only
            live = {}
        for n, t in runner.held.items():
            source = live.get(n, t)
            source = (source if has_data(source) else meta_twin(t)).detach()
            is_param = isinstance(t, torch.nn.Parameter)  # torch's verifier wants them kept
            weights[n] = torch.nn.Parameter(source, t.requires_grad) if is_param else source
        if not ep.graph_signature.output_specs:  # torch's serializer fails on it (unpacking)
            raise UsageTypeError(
                f"save_program(): graph {i} of {program.qualname} returns only "
                "constants (no tensor or size computed by the graph), which "
                "torch.export's serializer cannot write; return a tensor as well, or "
                "save a program whose outputs depend on its inputs")
        graph = json.loads(compat.serialize(ep, meta_twin))
        if "guards_code" in graph:  # torch >= 2.10: Python source torch would exec
            graph["guards_code"] = []  # coverage replaces it
        files[f"graph{i}.json"] = json.dumps(graph).encode()
        constants = {}
        for n, c in ep.constants.items():
            if not isinstance(c, torch.Tensor):
                raise UsageTypeError(f"save_program(): constant {n!r} of the program is a "
                                     f"{type(c).__name__}; only tensor constants can be saved")
            constants[n] = weights[n] if n in weights else c.detach()
        files[f"graph{i}.constants.pt"] = _bytes(torch.save, constants)
        variants.append({"case": to_json(case), "coverage": runner.coverage.to_json(),
                         "recipe": runner.recipe.to_json(), "training": runner.training})
    files["weights.pt"] = _bytes(torch.save, weights)
    return variants, all(not t.is_meta for t in weights.values())


def _check_texts(data: Any) -> None:
    """Check every text torch.export's graph JSON has read by ``sympify``
    (``expr_str``) or by ``pytree.treespec_loads`` (``in_spec``, ``out_spec``);
    a spec is replaced by the text written back from its checked structure.
    ``source_fn_stack`` metadata is dropped: torch resolves each name in it
    with ``getattr`` from ``torch`` (a name like ``torch._inductor.x`` imports
    that submodule), and no loaded program needs it; carriage returns in the
    other metadata texts (which fx prints as comments of generated code)
    become spaces."""
    stack = [data]
    while stack:
        item = stack.pop()
        for k, v in item.items() if isinstance(item, dict) else enumerate(item):
            if k == "expr_str":
                parse(v)
            elif k in ("in_spec", "out_spec") and isinstance(item, dict):
                item[k] = checked_treespec(v)
            elif isinstance(v, (dict, list)):
                stack.append(v)
        if isinstance(item, dict) and isinstance(item.get("metadata"), dict):
            metadata = item["metadata"]
            metadata.pop("source_fn_stack", None)
            for key, text in metadata.items():  # fx writes them into code comments, and a
                if isinstance(text, str):  # lone "\r" ends a comment for Python's compiler
                    metadata[key] = text.replace("\r", " ")


@contextmanager
def _reading(name: str, part: str) -> Iterator[None]:
    """Turn what a damaged or crafted file raises into one clear error."""
    try:
        yield
    except ProgramFileError:
        raise
    except UnsafeExpression as e:
        raise ProgramFileError(f"{name!r}: {part} holds something loading would execute ({e}); "
                               "refusing to load it") from None
    except ForbiddenOperator as e:
        raise ProgramFileError(f"{name!r}: {part}: {e}; refusing to load it (only load program "
                               "files written by torchdefer.save_program)") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise ProgramFileError(f"{name!r}: {part} is damaged or truncated ({e}); the file cannot "
                               "be read, save the program again") from None
    except Exception as e:  # whatever torch's deserializer or json raise on bad content
        raise ProgramFileError(f"{name!r}: {part} is not what torchdefer wrote "
                               f"({type(e).__name__}: {e}); save the program again") from None


def _read(name: str) -> dict[str, bytes]:
    """Every member of the archive, each header checked before anything is read (``_zip``).

    A missing or unreadable path raises the ``OSError`` ``open`` raises (it
    names the path); everything about the file's content, ``ProgramFileError``.
    """
    # Non-blocking: opening a FIFO named like a program must not wait for a writer.
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ProgramFileError(f"{name!r} is not a regular file; a program is read from a file "
                               "written by torchdefer.save_program")
    with open(fd, "rb") as f:
        with _reading(name, "the archive"), zipfile.ZipFile(f) as zf:
            members: dict[str, bytes] = {}
            declared = None  # the header first: it declares the others' sizes
            for member in sorted(checked_members(zf, info.st_size, name),
                                 key=lambda i: i.filename != "torchdefer.json"):
                if declared is not None:
                    checked_size(member, declared, name)
                with _reading(name, member.filename), zf.open(member) as stream:
                    members[member.filename] = stream.read()
                if member.filename == "torchdefer.json":
                    declared = _declared_sizes(members[member.filename])
            return members


def _declared_sizes(header: bytes) -> object:
    """The header's ``members`` table; ``None`` for files saved before it existed
    (a header that is no JSON object is reported when it is read)."""
    try:
        data = json.loads(header)
    except ValueError:
        return None
    return data.get("members") if isinstance(data, dict) else None


def _member(members: dict[str, bytes], member: str, name: str) -> bytes:
    if member not in members:
        raise ProgramFileError(f"{name!r}: {member} is missing; the file is incomplete, save the "
                               "program again")
    return members[member]


def _json(members: dict[str, bytes], member: str, name: str) -> Any:
    with _reading(name, member):
        return json.loads(_member(members, member, name))


def _tensors(members: dict[str, bytes], member: str, name: str) -> dict[str, torch.Tensor]:
    data = _member(members, member, name)
    nested_members(data, name, member)
    try:
        out = torch.load(io.BytesIO(data), weights_only=True, map_location=None)
    except Exception as e:
        raise ProgramFileError(f"{name!r}: {member} holds more than tensors, or is damaged; "
                               f"refusing to unpickle it ({type(e).__name__}); save the program "
                               "again") from None
    if not isinstance(out, dict) or not all(isinstance(v, torch.Tensor) for v in out.values()):
        raise ProgramFileError(f"{name!r}: {member} is not a dict of tensors; save the program "
                               "again")
    return out


def _bytes(save: Callable[[Any, io.BytesIO], None], obj: Any) -> bytes:
    """What ``torch.save`` or ``torch.jit.save`` writes for ``obj``."""
    buffer = io.BytesIO()
    save(obj, buffer)
    return buffer.getvalue()


def save(program: Program, path: str | os.PathLike[str]) -> None:
    """Deprecated name of :func:`save_program` (beside ``save_state_dict``,
    for weights, ``save`` read as if it wrote weights); removed in 0.3."""
    _renamed("save", "save_program")
    save_program(program, path)


def load(path: str | os.PathLike[str], *, allow_torchscript: bool = False) -> Program:
    """Deprecated name of :func:`load_program` (beside ``load_state_dict``,
    for weights, ``load`` read as if it loaded weights); removed in 0.3."""
    _renamed("load", "load_program")
    return load_program(path, allow_torchscript=allow_torchscript)


def _renamed(old: str, new: str) -> None:
    warnings.warn(f"torchdefer.{old} is renamed torchdefer.{new} (programs; the weights "
                  f"are torchdefer.{old}_state_dict's); the old name goes in torchdefer 0.3",
                  DeprecationWarning, stacklevel=3)
