"""A torch.distributed.checkpoint directory written through DCP's own writer, one tensor at a time.

``dcp.save`` plans from the state dict's metadata and asks its planner for
each tensor's data (``resolve_data``) only when it writes it. So the state
dict handed to it holds meta tensors of the right shape and dtype, and the
planner answers ``resolve_data`` with the next tensor the pipeline made. With
``single_file_per_rank=False`` every tensor goes to a file of its own
(``__0_<n>.distcp``): DCP's file loop keeps each file's tensors until the file
is closed, so one file per tensor is what keeps the peak at one tensor (one
file per rank would hold them all). The directory loads with ``dcp.load``
into a model's state dict: a torchtitan seed checkpoint (keys are the
model's state-dict names, as torchtitan's flattened model state).

Peak: DCP's loop still references the previous tensor while it asks for the
next one, so up to two consecutive tensors are alive (plus the pipeline's
slack); the writer's ``dtype=`` conversion happens whole, before DCP sees it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from torchdefer.checkpoint._pipeline import Pipeline
from torchdefer.checkpoint.write_errors import CheckpointWriteError
from torchdefer.checkpoint.write_plan import Entry

__all__ = ["check_available", "write_dcp"]


def write_dcp(directory: Path, entries: list[Entry], extras: dict[str, Any],
              pipeline: Pipeline) -> None:
    """The writer thread: ``dcp.save`` of placeholders, data resolved from ``pipeline``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    state: dict[str, Any] = {}
    for entry in entries:
        placeholder = torch.empty(entry.shape, dtype=entry.dtype, device="meta")
        for name in entry.names:  # adjacent: the planner answers them from one tensor
            state[name] = placeholder
    state.update(extras)
    planner = _planner(pipeline)
    writer = FileSystemWriter(str(directory), single_file_per_rank=False)
    try:
        dcp.save(state, storage_writer=writer, planner=planner, no_dist=True)
    finally:
        planner.release()


def check_available() -> None:
    """Refuse ``format="dcp"`` early where this torch has no torch.distributed."""
    if not torch.distributed.is_available():
        raise CheckpointWriteError(
            "format='dcp' needs torch.distributed, which this PyTorch build lacks. Use "
            "format='safetensors'."
        )


def _planner(pipeline: Pipeline) -> Any:
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.planner import WriteItemType

    class StreamingPlanner(DefaultSavePlanner):
        """Answers each tensor's data with the pipeline's next tensor, in plan order."""

        def __init__(self) -> None:
            super().__init__()
            self._entry: Entry | None = None
            self._tensor: torch.Tensor | None = None
            self._names: list[str] = []  # names of the current tensor still to come

        def resolve_data(self, write_item: Any) -> Any:
            if write_item.type == WriteItemType.BYTE_IO:
                return super().resolve_data(write_item)  # extra state, from the dict
            fqn = write_item.index.fqn
            if fqn in self._names:  # another name of a tied tensor
                self._names.remove(fqn)
                return self._tensor
            self.release()
            entry, self._tensor = pipeline.take()
            if fqn != entry.names[0]:
                raise RuntimeError(f"torch.distributed.checkpoint asked for '{fqn}' where "
                                   f"'{entry.name}' was due; torchdefer expects DCP to write "
                                   "in plan order. This is a bug, please report it.")
            self._entry, self._names = entry, list(entry.names[1:])
            return self._tensor

        def release(self) -> None:
            if self._entry is not None:
                pipeline.done(self._entry)
            self._entry, self._tensor, self._names = None, None, []

    return StreamingPlanner()
