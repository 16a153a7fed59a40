"""``torchdefer.save_state_dict``: stream a model's weights to disk, one tensor at a time.

For a deferred model this writes the initial weights eager construction would
have given without ever holding the model: each tensor is replayed, handed to
a writer thread, written and dropped, while the next one is replayed (a seed
checkpoint of a 70B model on a host that could never hold it). Materialized
and partly materialized models work too: real tensors are written as they are
now.

Two formats:

* ``"safetensors"``: the directory ``save_pretrained`` writes (shards, index,
  and for a transformers model ``config.json``), loadable by
  ``from_pretrained``, ``safetensors`` and :func:`torchdefer.load_state_dict`;
* ``"dcp"``: a ``torch.distributed.checkpoint`` directory, loadable by
  ``dcp.load`` into the model's state dict (a torchtitan seed checkpoint).

Sharded models (DTensor parameters: FSDP2, tensor parallel) are written as
DCP by every rank, each its own shards (:mod:`torchdefer.distributed._save`,
installed by the top-level package).

The files are written to a hidden sibling directory that is renamed to
``path`` once complete, so a failed save leaves nothing at ``path``.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from torchdefer._hooks import SHARDED_WRITER
from torchdefer.checkpoint import _dcp_writer, _hf_files, _safetensors_writer
from torchdefer.checkpoint._pipeline import Pipeline
from torchdefer.checkpoint._write_plan import Entry, WritePlan, plan_write
from torchdefer.errors import CheckpointExistsError, CheckpointUsageError, CheckpointWriteError
from torchdefer.materialize._value import one_call, replay_value
from torchdefer.materialize.progress import Progress, ProgressSpec
from torchdefer.recorder._tensor import DeferredTensor

__all__ = ["check_destination", "publish", "run_pipeline", "save_state_dict"]

Replayer = Callable[[DeferredTensor, str], torch.Tensor]
FORMATS = ("safetensors", "dcp")
# Bytes the writer may hold beyond the largest tensor, so that small tensors
# are replayed while a big one is written: peak = largest tensor + this.
_SLACK_BYTES = 256 << 20


def save_state_dict(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    format: str = "safetensors",
    dtype: torch.dtype | None = None,
    max_shard_size: int | str = "50GB",
    progress: ProgressSpec = None,
) -> Path:
    """Write ``model``'s state dict to the directory ``path``, one tensor at a time.

    For a deferred model the values are those eager construction gives (then
    ``.to(dtype)``), bit for bit, and the model stays deferred. Peak memory:
    the largest tensor (as replayed, before conversion) plus 256 MiB of small
    tensors made while a big one is written; for DCP, whose files hold whole
    ``torch.save``'d tensors, plus the converted copy of the tensor being
    converted when ``dtype`` converts. Replaying overlaps with writing (a
    writer thread), and each tensor is released once written.

    Args:
        model: a module, deferred (:func:`torchdefer.deferred_init`), materialized,
            or partly materialized (real tensors are written as they are).
        path: a directory that does not exist yet or is empty.
        format: ``"safetensors"`` (Hugging Face layout: ``model.safetensors``, or
            ``model-0000i-of-0000n.safetensors`` shards with
            ``model.safetensors.index.json``; plus ``config.json`` and
            ``generation_config.json`` for a transformers model) or ``"dcp"``
            (``torch.distributed.checkpoint``; a torchtitan seed checkpoint).
        dtype: write floating point and complex tensors in this dtype, rounded
            as ``Module.to(dtype)`` rounds; integer and bool tensors keep theirs.
            A complex tensor to a real dtype is refused (``.to`` would drop the
            imaginary part with only a warning).
        max_shard_size: safetensors only: bytes per file (int, ``"5GB"`` = 5*10**9,
            ``"4GiB"``), split as ``save_pretrained`` splits (its default,
            ``"50GB"``); a tensor larger than that gets a file of its own.
        progress: as for :func:`torchdefer.materialize_module` (task ``"save"``).

    Returns:
        ``path``, as a :class:`~pathlib.Path`.

    A transformers model is written under the names ``save_pretrained`` writes:
    where it reverts weight conversions that only rename (ViT, Llava, GraniteMoe),
    under the renamed names; conversions that compute tensors from several
    (Mixtral's fused experts) are refused in safetensors.

    A sharded model (DTensor parameters: FSDP2, tensor parallel, HSDP) is
    written with ``format="dcp"`` by calling this on every rank with the same
    ``path``: each rank writes its own shards (a chunk several ranks hold, once),
    and ``dcp.load`` reads the directory under any parallelism.

    Ties (one tensor under several names) are written once in safetensors, under
    the name ``save_pretrained`` keeps (``from_pretrained`` re-ties from the
    config; :func:`torchdefer.load_state_dict` fills every name), and under
    every name in DCP, as ``dcp.save(model.state_dict())`` does.

    Raises:
        CheckpointExistsError: ``path`` is a file or a non-empty directory.
        CheckpointWriteError: an unknown format, a bad ``max_shard_size``, a
            dtype safetensors cannot hold, ties or aliases the format cannot express,
            a transformers weight conversion that is not a rename (safetensors).
        CheckpointUsageError: ``dtype`` is not a floating point or complex
            torch dtype, or a sharded model in safetensors format.

    >>> import tempfile, torch, torchdefer
    >>> _ = torch.manual_seed(0)
    >>> model = torchdefer.deferred_init(torch.nn.Linear, 4, 2)
    >>> out = torchdefer.save_state_dict(model, tempfile.mkdtemp() + "/init")
    >>> sorted(p.name for p in out.iterdir())
    ['model.safetensors']
    >>> _ = torch.manual_seed(0); eager = torch.nn.Linear(4, 2)
    >>> from safetensors.torch import load_file
    >>> torch.equal(load_file(out / "model.safetensors")["weight"], eager.weight)
    True
    """
    _check_arguments(format, dtype)
    shard_bytes = _safetensors_writer.parse_size(max_shard_size)
    if _holds_dtensors(model):
        return _save_sharded(model, Path(path), format, dtype, progress)
    destination = check_destination(Path(path))
    if format == "dcp":
        _dcp_writer.check_available()
    plan = plan_write(model, format, dtype)
    if plan.hf and format == "safetensors":
        plan.entries = _hf_files.saved_layout(_hf_files.pretrained(model), plan.entries)
    staging = destination.parent / f".{destination.name}.partial-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        if format == "safetensors":
            _write_safetensors(model, plan, staging, shard_bytes, dtype, progress)
        else:
            with warnings.catch_warnings():  # entered and left on this thread
                # dcp.save's notice that it saves in one process, which is the point.
                warnings.filterwarnings("ignore", "torch.distributed is disabled",
                                        UserWarning)
                run_pipeline(plan.entries, progress, cast=True,
                             writer=lambda p: _dcp_writer.write_dcp(
                                 staging, plan.entries, plan.extras, p))
        publish(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return destination


def _write_safetensors(model: nn.Module, plan: WritePlan, staging: Path, shard_bytes: int,
                       dtype: torch.dtype | None, progress: ProgressSpec) -> None:
    shards = _safetensors_writer.layout(plan.entries, shard_bytes, plan.dropped)
    index = _safetensors_writer.index_json(
        shards, _hf_files.total_parameters(_hf_files.pretrained(model)) if plan.hf else None)
    if plan.hf:
        _hf_files.write_configs(_hf_files.pretrained(model), staging, dtype)
    # The writer converts to the written dtype piece by piece, so the producer
    # hands over tensors as replayed.
    run_pipeline(_safetensors_writer.write_order(shards), progress, cast=False,
                 writer=lambda p: _safetensors_writer.write_shards(staging, shards, p))
    if index is not None:
        (staging / "model.safetensors.index.json").write_text(index, encoding="utf-8")


def run_pipeline(entries: list[Entry], progress: ProgressSpec, *, cast: bool,
                 writer: Callable[[Pipeline], None], replay: Replayer | None = None) -> None:
    """Make ``entries`` on this thread (``replay`` for deferred ones) while ``writer``
    writes them on another; peak: the largest entry plus the slack."""
    budget = max((e.source_nbytes for e in entries), default=0) + _SLACK_BYTES
    total = sum(e.nbytes for e in entries)
    with Progress("save", len(entries), total, progress) as bar, \
            one_call(e.tensor for e in entries):
        pipeline = Pipeline(budget, bar)
        pipeline.run(entries, lambda e: _make(e, cast, replay), lambda: writer(pipeline))



def _make(entry: Entry, cast: bool, replay: Replayer | None = None) -> torch.Tensor:
    """The values of ``entry`` (on the calling thread): replayed, or the real tensor."""
    t = entry.tensor
    if isinstance(t, DeferredTensor):
        real = (replay or replay_value)(t, entry.name)
    else:
        real = t.detach()
    if cast:  # DCP takes whole tensors, on the CPU
        with torch.no_grad():
            real = real.detach().to("cpu", entry.dtype)
    return real


def _holds_dtensors(model: nn.Module) -> bool:
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return dtensor is not None and any(
        isinstance(t, dtensor) for t in model.state_dict(keep_vars=True).values())


def _save_sharded(model: nn.Module, path: Path, fmt: str, dtype: torch.dtype | None,
                  progress: ProgressSpec) -> Path:
    if fmt != "dcp":
        raise CheckpointUsageError(
            f"{type(model).__name__} is sharded (DTensor parameters: fully_shard or tensor "
            "parallel), and a safetensors file holds whole tensors, which no rank has. "
            "Pass format='dcp': every rank writes its own shards, and dcp.load reads them "
            "back under any parallelism. Or call save_state_dict before sharding."
        )
    # torchdefer.distributed's writer: the checkpoint package never imports it.
    return SHARDED_WRITER.get()(model, path, dtype=dtype, progress=progress)


def _check_arguments(fmt: str, dtype: torch.dtype | None) -> None:
    if fmt not in FORMATS:
        raise CheckpointWriteError(
            f"format={fmt!r} is not a checkpoint format torchdefer writes; pass "
            "'safetensors' (Hugging Face directory) or 'dcp' (torch.distributed.checkpoint)."
        )
    if dtype is None:
        return
    if not isinstance(dtype, torch.dtype):
        raise CheckpointUsageError(
            f"dtype= must be a torch.dtype such as torch.bfloat16, got {dtype!r}.")
    if not (dtype.is_floating_point or dtype.is_complex):
        raise CheckpointUsageError(
            f"dtype={dtype} is not a floating point or complex dtype; like Module.to(dtype), "
            "save_state_dict converts only floating point and complex tensors, and only to "
            "such a dtype."
        )


def check_destination(path: Path) -> Path:
    """``path``, if a checkpoint may be written there (new, or an empty directory)."""
    if path.is_file() or (path.exists() and not path.is_dir()):
        raise CheckpointExistsError(
            f"{path} is a file; save_state_dict writes a directory. Pass a new path.")
    if path.is_dir() and any(path.iterdir()):
        raise CheckpointExistsError(
            f"{path} is a directory that is not empty; save_state_dict never overwrites or "
            "mixes files with an earlier checkpoint. Pass a new or empty directory, or "
            "remove this one first."
        )
    return path


def publish(staging: Path, destination: Path) -> None:
    """Move the finished directory into place (onto an empty directory too, on POSIX)."""
    try:
        os.replace(staging, destination)
    except OSError as e:
        raise CheckpointExistsError(
            f"could not move the finished checkpoint from {staging} to {destination} "
            f"({e}); was {destination} created or filled meanwhile?"
        ) from e
