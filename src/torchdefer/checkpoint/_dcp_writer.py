"""A torch.distributed.checkpoint directory, written one tensor at a time.

``dcp.save`` plans from the state dict's metadata, then hands the plan to its
storage writer. So the state dict given to it holds meta placeholders of the
right shape and dtype (and the extra state as it is), and the storage writer
here, a ``FileSystemWriter`` whose ``write_data`` is its own loop, takes each
tensor from the pipeline, writes it under each of its names exactly as
``FileSystemWriter`` writes an item (``_compat.serialization.dcp_write_item``),
and lets it go before asking for the next. DCP's own file loop cannot do that:
its loop variable and its per-file dict still reference the tensor it wrote
while the next one is asked for, so two tensors would be alive at once.

The result is DCP's default layout, one ``__0_0.distcp`` file and
``.metadata``: what ``dcp.save(model.state_dict())`` writes with one process,
loadable with ``dcp.load`` into a model's state dict (a torchtitan seed
checkpoint: its keys are the model's state-dict names, as torchtitan's
flattened model state). DCP's planning, metadata and ``.metadata`` file are
its own; only the loop over the items is replaced.

Peak: one tensor as replayed, and its converted copy while ``dtype=``
converts it (DCP's format is a ``torch.save`` of the whole tensor), plus the
pipeline's slack for small tensors made while a big one is written.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from io import UnsupportedOperation
from pathlib import Path
from typing import Any

import torch
from torch.futures import Future

from torchdefer._compat import serialization as compat
from torchdefer.checkpoint._pipeline import Pipeline
from torchdefer.checkpoint._write_plan import Entry
from torchdefer.errors import CheckpointWriteError, InternalError, UnsupportedError

__all__ = ["check_available", "placeholders", "streaming_writer", "write_dcp"]


def write_dcp(directory: Path, entries: list[Entry], extras: dict[str, Any],
              pipeline: Pipeline, placeholder: Callable[[Entry], Any] | None = None,
              ranks: bool = False) -> None:
    """The writer thread: ``dcp.save`` of placeholders, each tensor from ``pipeline``.

    ``placeholder(entry)`` is what DCP plans from (default: a meta tensor of the
    entry's shape and written dtype; a sharded model's: a DTensor around one).
    ``ranks``: every rank of the default process group writes its entries into
    ``directory`` (the same path on every rank), as ``dcp.save`` does.
    """
    import torch.distributed.checkpoint as dcp

    state = placeholders(entries, placeholder or _meta)
    state.update(extras)
    writer = streaming_writer(directory, entries, pipeline)
    dcp.save(state, storage_writer=writer, no_dist=not ranks)


def _meta(entry: Entry) -> torch.Tensor:
    return torch.empty(entry.shape, dtype=entry.dtype, device="meta")


def placeholders(entries: list[Entry], make: Callable[[Entry], Any]) -> dict[str, Any]:
    """The state dict DCP plans from: each entry's placeholder under each of its names."""
    state: dict[str, Any] = {}
    for entry in entries:
        placeholder = make(entry)
        for name in entry.names:
            state[name] = placeholder
    return state


def streaming_writer(directory: Path, entries: list[Entry], pipeline: Pipeline) -> Any:
    """A ``FileSystemWriter`` that writes ``entries`` in order, as ``pipeline`` makes them."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.planner import WriteItemType

    class StreamingWriter(FileSystemWriter):
        """One file per rank; each tensor written under all its names, then released."""

        def write_data(self, plan: Any, planner: Any) -> Future:
            file_name = compat.dcp_file_name(plan, 0)
            tensor_items: dict[str, list[Any]] = {}
            results = []
            with self.fs.create_stream(self.fs.concat_path(self.path, file_name), "wb") as f:
                for item in plan.items:
                    if item.type == WriteItemType.BYTE_IO:  # extra state, from the dict
                        data = planner.resolve_data(item)
                        results.append(compat.dcp_write_item(self, f, data, item, file_name))
                    else:
                        tensor_items.setdefault(item.index.fqn, []).append(item)
                for entry in entries:
                    results.extend(self._write_entry(f, file_name, entry, tensor_items))
                if tensor_items:
                    raise InternalError(f"torchdefer's DCP writer left {sorted(tensor_items)} "
                                       "unwritten; this is a bug, please report it.")
                if self.sync_files:
                    _fsync(f)
            future: Future = Future()
            future.set_result(results)
            return future

        def _write_entry(self, f: Any, file_name: str, entry: Entry,
                         tensor_items: dict[str, list[Any]]) -> list[Any]:
            taken, tensor = pipeline.take()
            if taken is not entry:
                raise InternalError(f"torchdefer's DCP writer got '{taken.name}' where "
                                   f"'{entry.name}' was due; this is a bug, please report it.")
            tensor = _dense_cpu(tensor)
            results = []
            for name in entry.names:
                for item in tensor_items.pop(name, ()):
                    _check_whole(item, tensor)
                    results.append(compat.dcp_write_item(self, f, tensor, item, file_name))
            del tensor  # before done(): the pipeline may then make the next one
            if compat.torch_save_keeps_storages():
                gc.collect(1)  # torch.save's cycle, young: about 0.03 ms
            pipeline.done(entry)
            return results

    return StreamingWriter(str(directory))


def _check_whole(item: Any, tensor: torch.Tensor) -> None:
    """DCP plans one item per tensor (per local shard): never write a whole tensor for
    a part of one."""
    sizes = tuple(item.tensor_data.chunk.sizes)
    if sizes != tuple(tensor.shape):
        raise UnsupportedError(
            f"torch.distributed.checkpoint planned '{item.index.fqn}' as a chunk of shape "
            f"{sizes}, but its tensor here has shape {tuple(tensor.shape)}; this torch "
            f"{torch.__version__} plans differently from what torchdefer's DCP writer "
            "supports. Please report it; meanwhile use format='safetensors'.")


def _dense_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """What DCP's loader hands ``torch.save``: on the CPU, owning exactly its bytes."""
    tensor = tensor.detach().cpu()
    if tensor.untyped_storage().nbytes() != tensor.nbytes:
        tensor = tensor.clone()  # torch.save writes whole storages; keeps the layout
    return tensor


def _fsync(f: Any) -> None:
    try:
        os.fsync(f.fileno())
    except (AttributeError, UnsupportedOperation):
        os.sync()


def check_available() -> None:
    """Refuse ``format="dcp"`` early where this torch cannot write it."""
    if not torch.distributed.is_available():
        raise CheckpointWriteError(
            "format='dcp' needs torch.distributed, which this PyTorch build lacks. Use "
            "format='safetensors'."
        )
    try:
        compat.check_dcp_writer()
    except ImportError as e:
        raise CheckpointWriteError(
            f"format='dcp' needs torch.distributed.checkpoint's file writer as torch 2.8-2.15 "
            f"have it; this torch {torch.__version__} differs ({e}). Use "
            "format='safetensors', or save a materialized model with dcp.save."
        ) from e
