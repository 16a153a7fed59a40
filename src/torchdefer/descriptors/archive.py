"""``save`` / ``load``: programs on disk, descriptors and checks included.

The file is a zip archive:

* ``torchdefer.json``: format version, backend, the specialization
  (signature, descriptor trees, ranges) as JSON, whether weights are stored;
* export backend: ``program.json`` (``torch.export``'s JSON graph format),
  ``weights.pt`` and ``constants.pt`` (tensors only);
* jit backend: ``program.ts`` (a ``torch.jit.save`` archive of the scripted
  or traced module); a traced program's output structure is stored as
  ``torch.utils._pytree`` JSON in the header.

Loading never unpickles arbitrary objects. Descriptors are JSON; tensors are
read with ``torch.load(weights_only=True)``; the TorchScript archive is read by
``torch.jit.load``, whose unpickler only builds TorchScript values; output
structures are rebuilt only from types registered with ``torch.utils._pytree``
in the loading process. We do not
call ``torch.export.load``: it falls back to ``weights_only=False`` (and to
``pickle.loads`` for some constants) when a payload is not plain tensors, so a
crafted file could run code.

A program of a deferred (or meta) model is saved with meta-tensor weights:
nothing of the model's size is written or allocated on load; bind real
weights with :meth:`Program.with_weights`.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from typing import Any

import torch
from torch._export.serde import serialize as serde

from torchdefer.descriptors.program import Program
from torchdefer.descriptors.specialization import Specialization
from torchdefer.descriptors.tree import from_json as tree_from_json
from torchdefer.descriptors.tree import to_json as tree_to_json

__all__ = ["load", "save"]

_FORMAT = "torchdefer.program"
_VERSION = 1


def save(program: Program, path: str | os.PathLike[str]) -> None:
    """Write ``program`` to ``path``; :func:`load` reads it back, checks included.

    Weights of the program's module are stored when they are real tensors;
    when the module is deferred (or on the meta device) only their metadata
    is stored.

    Example:
        >>> import torch, torchdefer, tempfile, os
        >>> from torchdefer.descriptors import MetaTensorType
        >>> x = MetaTensorType(["b", 3], torch.float32)
        >>> p = torchdefer.script(torch.nn.Linear(3, 2), {"input": x})
        >>> f = os.path.join(tempfile.mkdtemp(), "linear.tdp")
        >>> torchdefer.save(p, f)
        >>> torchdefer.load(f)(torch.ones(4, 3)).shape
        torch.Size([4, 2])
    """
    if not isinstance(program, Program):
        raise TypeError(
            f"save() takes a program from torchdefer.script(), got {type(program).__name__}"
        )
    header: dict[str, Any] = {
        "format": _FORMAT,
        "version": _VERSION,
        "backend": program.backend,
        "spec": program._spec.to_json(),
    }
    files: dict[str, bytes] = {}
    if program.backend == "export":
        header["weights"] = _export_files(program, files)
    else:
        from torchdefer.descriptors.jit_backend import save_bytes

        files["program.ts"] = save_bytes(program._runner)
        header["jit"] = program._runner.header()
        header["weights"] = True
        try:  # export outputs are recomputed from the graph; jit's are kept
            header["outputs"] = tree_to_json(program.output_descriptors)
        except (TypeError, AttributeError):
            header["outputs"] = None
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("torchdefer.json", json.dumps(header, indent=1))
        for name, data in files.items():
            zf.writestr(name, data)


def load(path: str | os.PathLike[str]) -> Program:
    """Read a program written by :func:`save`; it checks and runs as before.

    Returns:
        The program; if it was saved without weights (deferred model), bind
        them with :meth:`Program.with_weights` before calling it.

    Raises:
        ValueError: the file is not a torchdefer program, or holds payloads
            other than tensors.
    """
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        if "torchdefer.json" not in names:
            raise ValueError(
                f"{os.fspath(path)!r} is not a torchdefer program (no torchdefer.json)"
            )
        header = json.loads(zf.read("torchdefer.json"))
        if header.get("format") != _FORMAT or header.get("version") != _VERSION:
            raise ValueError(
                f"{os.fspath(path)!r}: unsupported format {header.get('format')!r} version "
                f"{header.get('version')!r}; this torchdefer reads {_FORMAT} version {_VERSION}"
            )
        payload = {n: zf.read(n) for n in names if n != "torchdefer.json"}
    spec = Specialization.from_json(header["spec"])
    if header["backend"] == "export":
        return _load_export(spec, payload, path)
    if header["backend"] == "jit":
        from torchdefer.descriptors.jit_backend import load_program

        outputs = header.get("outputs")
        return load_program(
            spec,
            payload["program.ts"],
            header.get("jit"),
            None if outputs is None else tree_from_json(outputs),
        )
    raise ValueError(f"{os.fspath(path)!r}: unknown backend {header['backend']!r}")


def _export_files(program: Program, files: dict[str, bytes]) -> bool:
    ep = program._runner.program
    live = program._current_weights_or_none() or {}

    def stored(name: str, t: torch.Tensor) -> torch.Tensor:
        # Live module weights win; the graph's own (loaded) weights are real
        # unless fake/meta; anything without data is stored as a meta twin.
        source = live.get(name, t)
        if source.is_meta or type(source).__name__ == "FakeTensor" or _has_no_data(source):
            source = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="meta")
        source = source.detach()
        if isinstance(t, torch.nn.Parameter):
            return torch.nn.Parameter(source, t.requires_grad)
        return source

    state = {name: stored(name, t) for name, t in ep.state_dict.items()}
    constants = {}
    for name, value in ep.constants.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"save(): constant {name!r} of the program is a {type(value).__name__}; only "
                "tensor constants can be saved"
            )
        constants[name] = stored(name, value)
    # The graph is serialized against meta twins (its verifier wants every
    # weight present); the weights themselves go to weights.pt.
    twins = {k: _meta(v) for k, v in state.items()}
    old = ep._state_dict, ep._constants, ep._example_inputs
    ep._state_dict, ep._constants, ep._example_inputs = twins, {}, None
    try:
        artifact = serde.serialize(
            ep,
            serialize_state_dict=False,
            serialize_constants=False,
            serialize_example_inputs=False,
        )
    finally:
        ep._state_dict, ep._constants, ep._example_inputs = old
    files["program.json"] = artifact.exported_program
    files["weights.pt"] = _tensor_bytes(state)
    files["constants.pt"] = _tensor_bytes(constants)
    return all(not t.is_meta for t in [*state.values(), *constants.values()])


def _meta(t: torch.Tensor) -> torch.Tensor:
    twin = t.to("meta")
    return torch.nn.Parameter(twin, t.requires_grad) if isinstance(t, torch.nn.Parameter) else twin


def _has_no_data(t: torch.Tensor) -> bool:
    from torchdefer.descriptors.program import _is_deferred_tensor

    return _is_deferred_tensor(t)


def _load_export(spec: Specialization, payload: dict[str, bytes], path: Any) -> Program:
    from torchdefer.descriptors.export_backend import ExportRunner
    from torchdefer.descriptors.outputs import ExportSymbols, output_descriptors

    state = _read_tensors(payload["weights.pt"], "weights.pt", path)
    constants = _read_tensors(payload["constants.pt"], "constants.pt", path)
    artifact = serde.SerializedArtifact(payload["program.json"], state, constants, b"")
    ep = serde.deserialize(artifact)
    symbols = ExportSymbols.from_program(ep, list(spec.dynamic_leaves()))
    runner = ExportRunner(ep, symbols.display)
    real = all(not t.is_meta for t in [*state.values(), *constants.values()])
    return Program(
        backend="export",
        spec=spec,
        runner=runner,
        output_descriptors=output_descriptors(ep, symbols, spec.ranges),
        module=None,
        weights=dict(ep.state_dict) if real else None,
        weightless=not real,
    )


def _tensor_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def _read_tensors(data: bytes, member: str, path: Any) -> dict[str, torch.Tensor]:
    try:
        out = torch.load(io.BytesIO(data), weights_only=True, map_location=None)
    except Exception as e:
        raise ValueError(
            f"{os.fspath(path)!r}: {member} holds more than tensors; refusing to unpickle it "
            f"({type(e).__name__})"
        ) from e
    if not isinstance(out, dict) or not all(isinstance(v, torch.Tensor) for v in out.values()):
        raise ValueError(f"{os.fspath(path)!r}: {member} is not a dict of tensors")
    return out
