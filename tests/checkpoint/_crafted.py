"""Checkpoint files built at test time, good and broken (no binary blobs in the repo).

Each builder writes what a careless or hostile user could hand to
``torchdefer.load_state_dict``; the tests compare torchdefer with the tools
people use on the same file (``torch.load``, ``safetensors``, ``dcp.load``,
accelerate).
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import warnings
import zipfile
from pathlib import Path

import torch
from torch import nn

import torchdefer


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))


def trained_state(build=mlp, seed: int = 1) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return build().state_dict()


def deferred(build=mlp, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return torchdefer.deferred_init(build)


def eager(build=mlp, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build()


class RunsCode:
    """Unpickling this creates the directory ``marker``: proof that a file ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def rezip(src: Path, dst: Path, compression: int = zipfile.ZIP_STORED,
          shorten: str | None = None) -> Path:
    """``src`` (a torch.save zip) rewritten with ``compression``; the member ending in
    ``shorten`` loses its last 8 bytes (a record shorter than data.pkl declares)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if shorten and info.filename.endswith(shorten):
                data = data[:-8]
            zout.writestr(info.filename, data, compress_type=compression)
    return dst


def raw_safetensors(path: Path, entries: dict[str, tuple[str, list[int], bytes]]) -> Path:
    """A safetensors file written byte by byte: key -> (dtype name, shape, data)."""
    header, blobs, offset = {}, [], 0
    for key, (dtype, shape, data) in entries.items():
        header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


def sharded_safetensors(directory: Path, state: dict[str, torch.Tensor],
                        shards: list[list[str]]) -> Path:
    """``state`` in one file per list of keys, with a Hugging Face index."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i, keys in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: state[k].contiguous() for k in keys}, directory / name)
        weight_map.update({k: name for k in keys})
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def dcp_save(directory: Path, state: dict) -> Path:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=directory)
    return directory


def edit_dcp_metadata(directory: Path, edit) -> Path:
    """Rewrite ``.metadata`` (written by this test, so plain pickle is fine here)."""
    path = directory / ".metadata"
    with path.open("rb") as f:
        metadata = pickle.load(f)
    edit(metadata)
    with path.open("wb") as f:
        pickle.dump(metadata, f)
    return directory


def snapshot(module: nn.Module) -> dict[str, tuple[type, bool, torch.Tensor | None, int]]:
    """Each tensor's object identity, class, deferred-ness and (if real) a copy of its value."""
    out = {}
    for name, t in [*module.named_parameters(remove_duplicate=False),
                    *module.named_buffers(remove_duplicate=False)]:
        real = not torchdefer.is_deferred(t)
        out[name] = (type(t), real, t.detach().clone() if real else None, id(t))
    return out


def assert_unchanged(module: nn.Module, before) -> None:
    after = snapshot(module)
    assert after.keys() == before.keys()
    for name, (cls, real, value, ident) in before.items():
        cls2, real2, value2, ident2 = after[name]
        assert (cls2, real2, ident2) == (cls, real, ident), f"{name} changed"
        if real:
            assert value2.dtype == value.dtype and torch.equal(_bits(value2), _bits(value)), name


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)
