"""Loading a checkpoint into a deferred model: assign what it has, materialize the rest.

The everyday path for a deferred model::

    model = torchdefer.deferred_init(LlamaForCausalLM, config)   # nothing allocated
    torchdefer.load_state_dict(model, "checkpoint/")              # safetensors, DCP, dict

Each tensor the checkpoint provides is converted to the dtype (and device) of
the module's tensor, as ``Module.load_state_dict`` would copy it, and swapped
in with ``torch.utils.swap_tensors``: the deferred object itself becomes the
loaded tensor, so tied parameters stay tied and no replay of its recorded
init runs. Afterwards only what the checkpoint lacks (a new head,
non-persistent buffers such as rotary ``inv_freq``) is materialized from the
recording. Peak memory: the checkpoint's tensors, plus the missing ones, plus
one tensor being converted.

Checkpoints in ``torch.distributed.checkpoint`` (DCP) format, and modules
sharded with FSDP2 or DTensor, are handed to
``torchdefer.distributed.checkpoint`` (wired in by the top-level package; the
core never imports ``torch.distributed``).

What this module deliberately does not do: run ``load_state_dict`` pre-hooks
or ``_load_from_state_dict`` overrides. Keys are matched to the names of
``module.state_dict()`` as they are.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchdefer.fake.device import device_available
from torchdefer.materialize.api import materialize_module, materialized_nbytes
from torchdefer.materialize.cache import cache_for
from torchdefer.materialize.convert import cast, check_dtype
from torchdefer.materialize.progress import Progress, ProgressSpec
from torchdefer.materialize.swap import swap_in
from torchdefer.recorder.graph import Value
from torchdefer.recorder.tensor import DeferredTensor, holds_deferred

__all__ = [
    "CheckpointSource",
    "LoadResult",
    "TensorGroup",
    "assign_loaded",
    "is_dcp_checkpoint",
    "load_state_dict",
    "open_checkpoint",
    "set_distributed_loader",
    "tensor_groups",
]

Source = Mapping[str, torch.Tensor] | str | os.PathLike


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What :func:`load_state_dict` did, key by key (names as in ``module.state_dict()``)."""

    loaded_keys: tuple[str, ...]  # assigned from the checkpoint
    missing_keys: tuple[str, ...]  # not in the checkpoint: materialized from the recording
    unexpected_keys: tuple[str, ...]  # in the checkpoint, not in the module: ignored


@dataclass(slots=True)
class TensorGroup:
    """One tensor object of a module and every name it is reachable by (ties)."""

    tensor: torch.Tensor
    names: list[str]  # state-dict names, in module order
    persistent: bool = True  # False: a non-persistent buffer (not in the state dict)


# ---- sources -------------------------------------------------------------------------


class CheckpointSource:
    """Tensors by name from a state dict, safetensors files or a ``torch.save`` file.

    ``get`` reads one tensor at a time (safetensors reads only that tensor), so
    loading never holds more of the file than the tensors already assigned.
    """

    def __init__(self, keys: list[str], shape: Callable[[str], tuple[int, ...]],
                 get: Callable[[str], torch.Tensor], where: str) -> None:
        self.keys = keys
        self.shape = shape
        self.get = get
        self.where = where


def open_checkpoint(source: Source) -> CheckpointSource:
    """A :class:`CheckpointSource` for a state dict, a ``.safetensors`` file, a
    directory of them (with or without ``model.safetensors.index.json``) or a
    ``torch.save`` file (``.bin``, ``.pt``, ``.pth``; loaded with ``mmap=True``)."""
    if isinstance(source, Mapping):
        sd = source
        return CheckpointSource(list(sd), lambda k: tuple(sd[k].shape), lambda k: sd[k],
                                "the state dict")
    path = Path(source)
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if files:
            return _safetensors(files, path)
        raise FileNotFoundError(
            f"{path} holds neither *.safetensors files nor a torch.distributed.checkpoint "
            "(.metadata); pass a state dict, a .safetensors file, a directory of them, a "
            "torch.save file or a DCP checkpoint directory."
        )
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist.")
    if path.suffix == ".safetensors":
        return _safetensors([path], path)
    sd = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    if not isinstance(sd, Mapping):
        raise TypeError(f"{path} holds a {type(sd).__name__}, not a state dict of tensors.")
    return CheckpointSource(list(sd), lambda k: tuple(sd[k].shape), lambda k: sd[k], str(path))


def _safetensors(files: list[Path], where: Path) -> CheckpointSource:
    try:
        from safetensors import safe_open
    except ImportError as e:
        raise ImportError(
            f"Loading {where} needs safetensors: pip install 'torchdefer[safetensors]' "
            "(or pip install safetensors)."
        ) from e
    owner: dict[str, Any] = {}
    for file in files:
        handle = safe_open(str(file), framework="pt", device="cpu")
        for key in handle.keys():
            owner[key] = handle

    def shape(key: str) -> tuple[int, ...]:
        return tuple(owner[key].get_slice(key).get_shape())

    return CheckpointSource(list(owner), shape, lambda key: owner[key].get_tensor(key),
                            str(where))


def is_dcp_checkpoint(source: object) -> bool:
    """Whether ``source`` is a ``torch.distributed.checkpoint`` directory (has ``.metadata``)."""
    if isinstance(source, Mapping):
        return False
    try:
        return Path(source).joinpath(".metadata").is_file()  # type: ignore[arg-type]
    except TypeError:
        return False


# ---- module side ---------------------------------------------------------------------


def tensor_groups(module: nn.Module) -> list[TensorGroup]:
    """Every parameter and buffer object of ``module``, with all its names (tied ones share)."""
    groups: dict[int, TensorGroup] = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for kind in ("_parameters", "_buffers"):
            for attr, t in getattr(sub, kind).items():
                if t is None:
                    continue
                name = f"{prefix}.{attr}" if prefix else attr
                group = groups.get(id(t))
                if group is None:
                    group = groups[id(t)] = TensorGroup(t, [])
                group.names.append(name)
                if kind == "_buffers" and attr in sub._non_persistent_buffers_set:
                    group.persistent = False
    return list(groups.values())


def assign_loaded(group: TensorGroup, loaded: torch.Tensor, device: torch.device | None,
                  dtype: torch.dtype | None) -> torch.Tensor:
    """Put ``loaded`` into the module where ``group``'s tensor is; returns the real tensor.

    A deferred tensor is replaced by ``loaded`` itself when dtype and device
    already match (no copy: the module shares the checkpoint's storage, as
    ``load_state_dict(..., assign=True)``), else by its conversion. A real
    tensor is copied into, as ``Module.load_state_dict`` does.
    """
    target = group.tensor
    name = group.names[0]
    if tuple(loaded.shape) != tuple(target.shape):
        raise ValueError(
            f"'{name}' has shape {tuple(target.shape)} in the module but "
            f"{tuple(loaded.shape)} in the checkpoint; check that the checkpoint belongs "
            "to this model and config."
        )
    if not isinstance(target, DeferredTensor):
        with torch.no_grad():
            target.copy_(loaded)
        return target
    place = device or target.fake_device
    if not device_available(place):
        raise RuntimeError(
            f"'{name}' was recorded on '{place}', which this process does not have. Pass "
            "device= (e.g. torchdefer.load_state_dict(model, path, device='cpu'))."
        )
    with torch.no_grad():
        real = loaded.detach().to(device=place, dtype=target.dtype)
    real = cast(real, dtype)
    value = target._value
    swap_in(target, real, name)
    # Later recorded writes to this storage would never reach the loaded tensor.
    value.storage.materialized = True
    _keep_for_views(value, target, device)  # target is the loaded tensor now
    return real


def _keep_for_views(value: Value, real: torch.Tensor, device: torch.device | None) -> None:
    """Let deferred views of a loaded tensor (``row = m.weight[0]`` held outside the
    module) be rebuilt over the loaded storage, as eager's views see the loaded
    values: the replay cache keeps it, when it is all of the recorded storage."""
    meta = value.meta
    if (real.dtype != meta.dtype or real.stride() != meta.stride or meta.offset != 0
            or real.untyped_storage().nbytes() != value.storage.nbytes):
        return
    graph = value.node.graph
    if graph is None:
        return
    cache = cache_for(graph)
    keys = {"recorded" if device is None or device == meta.device else str(device)}
    if device is not None:
        keys.add(str(device))
    for key in keys:
        cache.store(value, value.storage.version, key, real)


def _pick(group: TensorGroup, present: list[str], source: CheckpointSource) -> torch.Tensor:
    """The checkpoint's tensor for a tied group; refuse ties whose values differ."""
    loaded = source.get(present[0])
    for other in present[1:]:
        value = source.get(other)
        if value is not loaded and not torch.equal(value, loaded):
            raise ValueError(
                f"'{present[0]}' and '{other}' are the same (tied) tensor in the module, but "
                f"{source.where} holds different values for them. Untie them in the model "
                "(e.g. tie_word_embeddings=False) or drop one key from the checkpoint."
            )
    return loaded


# ---- the entry point -----------------------------------------------------------------

# How to load DCP checkpoints and sharded modules (torchdefer.distributed); the
# core never imports torch.distributed, the top-level package injects it.
_distributed_loader: list[Callable[..., LoadResult]] = []


def set_distributed_loader(fn: Callable[..., LoadResult]) -> None:
    """Install the loader for DCP checkpoints and FSDP2/DTensor-sharded modules."""
    _distributed_loader[:] = [fn]


def load_state_dict(
    module: nn.Module,
    source: Source,
    *,
    strict: bool = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    materialize_missing: bool = True,
    progress: ProgressSpec = None,
) -> LoadResult:
    """Load a checkpoint into a deferred module; materialize only what it lacks.

    Each tensor in ``source`` replaces the module's deferred tensor of that
    name (converted to the module tensor's dtype, as ``Module.load_state_dict``
    would copy it; no copy when it already matches), without replaying its
    recorded init. Tied parameters stay tied: a checkpoint holding one name of
    a tied pair fills both. Then, unless ``materialize_missing=False``, the
    tensors the checkpoint did not provide are materialized from the recording,
    bit for bit as eager construction made them. Already real tensors are
    copied into.

    Args:
        module: a module built by :func:`torchdefer.deferred_init` (or partly real).
        source: a state dict; a ``.safetensors`` file or a directory of them
            (Hugging Face layout, sharded or not); a ``torch.save`` file; or a
            ``torch.distributed.checkpoint`` directory. Modules sharded with
            FSDP2 ``fully_shard`` or DTensor take any of these: each rank
            keeps only its shard.
        strict: raise if a key is missing from the checkpoint or unexpected,
            before anything is loaded.
        device: where to put the tensors; ``None``: each tensor's recorded device.
        dtype: convert floating point tensors to this dtype (loaded and
            missing ones), as ``module.to(dtype)`` would afterwards.
        materialize_missing: materialize the tensors the checkpoint lacks.
        progress: as for :func:`torchdefer.materialize_module`.

    Returns:
        A :class:`LoadResult` with the loaded, missing (materialized from the
        recording) and unexpected (ignored, with a warning) keys.

    >>> import torch, torchdefer
    >>> def build():
    ...     return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    >>> _ = torch.manual_seed(0); eager = build()
    >>> _ = torch.manual_seed(0); model = torchdefer.deferred_init(build)
    >>> checkpoint = {"0.weight": torch.ones(4, 4), "0.bias": torch.zeros(4)}
    >>> torchdefer.load_state_dict(model, checkpoint).missing_keys
    ('1.weight', '1.bias')
    >>> model[0].weight.data_ptr() == checkpoint["0.weight"].data_ptr()   # assigned, not copied
    True
    >>> torch.equal(model[1].weight, eager[1].weight)   # the new head, as built eagerly
    True
    """
    check_dtype(dtype)
    device = None if device is None else torch.device(device)
    if is_dcp_checkpoint(source) or _is_sharded(module):
        if not _distributed_loader:
            raise TypeError(
                "Loading a torch.distributed.checkpoint directory or into a sharded module "
                "needs torchdefer.distributed; import torchdefer (not only its subpackages)."
            )
        return _distributed_loader[0](module, source, strict=strict, device=device,
                                      dtype=dtype, materialize_missing=materialize_missing,
                                      progress=progress)
    checkpoint = open_checkpoint(source)
    groups = tensor_groups(module)
    result = plan_keys(groups, checkpoint.keys, strict, checkpoint.where)
    present = set(checkpoint.keys)
    work = [(g, [n for n in g.names if n in present]) for g in groups]
    work = [(g, names) for g, names in work if names]
    total = sum(loaded_nbytes(g.tensor, dtype) for g, _ in work)
    with Progress("load", len(work), total, progress) as bar:
        for group, names in work:
            loaded = _pick(group, names, checkpoint)
            real = assign_loaded(group, loaded, device, dtype)
            del loaded
            bar.advance(names[0], real.nbytes)
    if materialize_missing:
        materialize_module(module, device, dtype=dtype, progress=progress)
    return result


def loaded_nbytes(tensor: torch.Tensor, dtype: torch.dtype | None) -> int:
    """The bytes :func:`assign_loaded` leaves for ``tensor``: a deferred one takes
    ``dtype``, a real one is copied into as it is."""
    if isinstance(tensor, DeferredTensor):
        return materialized_nbytes(tensor, dtype)
    return tensor.numel() * tensor.element_size()


def plan_keys(groups: list[TensorGroup], keys: list[str], strict: bool,
              where: str) -> LoadResult:
    """Sort the keys into loaded, missing and unexpected; raise or warn as asked."""
    present = set(keys)
    persistent = [g for g in groups if g.persistent]
    known = {n for g in persistent for n in g.names}
    loaded = tuple(n for g in persistent for n in g.names if n in present)
    # A tied group is filled by any one of its names (HF checkpoints store one).
    missing = tuple(n for g in persistent if not present.intersection(g.names) for n in g.names)
    unexpected = tuple(k for k in keys if k not in known)
    if strict and (missing or unexpected):
        raise KeyError(
            f"Loading {where} with strict=True: missing keys {_few(missing)}, unexpected "
            f"keys {_few(unexpected)}. Pass strict=False to materialize missing tensors "
            "from the recording and ignore unexpected ones."
        )
    if unexpected:
        warnings.warn(
            f"{where} has {len(unexpected)} keys the module does not: {_few(unexpected)}; "
            "they were not loaded.",
            stacklevel=3,
        )
    return LoadResult(loaded, missing, unexpected)


def _few(names: tuple[str, ...]) -> str:
    if not names:
        return "none"
    shown = ", ".join(repr(n) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _is_sharded(module: nn.Module) -> bool:
    return any(not isinstance(t, DeferredTensor) and holds_deferred(t) for t in _tensors(module))


def _tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()

