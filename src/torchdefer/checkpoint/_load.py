"""``torchdefer.load_state_dict``: validate the whole checkpoint, then assign it, then
materialize only what it lacks.

The everyday path for a deferred model::

    model = torchdefer.deferred_init(LlamaForCausalLM, config)   # nothing allocated
    torchdefer.load_state_dict(model, "checkpoint/")              # safetensors, DCP, dict

Four steps, so that a bad checkpoint never half-loads a model:

1. *validate*: open the source and read what it declares (keys, shapes,
   dtypes; no tensor data), match it to the module's names, check every
   shape, every entry's readability and every device;
2. *prepare*: read each tensor, check tied names agree, convert it as
   ``Module.load_state_dict`` would copy it (and to ``dtype=``), with eager's
   layout and a storage of its own (safetensors: the file's mapped pages
   themselves, mapped ahead by a thread meanwhile: ``_pages``);
3. *replay* what the checkpoint lacks (a new head, non-persistent buffers
   such as rotary ``inv_freq``) from the recording, bit for bit as eager
   built it, and check every swap the install will make
   (:class:`~torchdefer.checkpoint._install.Installation`);
4. *install*: swap the prepared and replayed tensors in
   (``torch.utils.swap_tensors`` style: the deferred object itself becomes
   the loaded tensor, so ties and earlier references hold), then copy into
   tensors already real. Missing tensors that are views of loaded ones are
   rebuilt over them last, as eager's views show the loaded values.

A failure in steps 1-3 leaves every tensor as it was; a swap failing in
step 4 anyway undoes the swaps made before it. Peak memory: the
checkpoint's tensors, plus the missing ones, plus one tensor being converted.

What this module deliberately does not do: run a file's code (pickles are read
``weights_only``, DCP metadata with an allowlist), run ``load_state_dict``
pre-hooks or ``_load_from_state_dict`` overrides, or load non-persistent buffers.
Modules sharded with FSDP2 or DTensor are handed to
``torchdefer.distributed._load`` (wired in by the top-level package).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from torchdefer._hooks import DISTRIBUTED_LOADER

# The readers (_safetensors_files, _torch_save) are imported with the package, not by
# open_checkpoint inside the first load: ~4 ms of a 1B model's load.
from torchdefer.checkpoint import _pages, _safetensors_files, _torch_save  # noqa: F401
from torchdefer.checkpoint._assign import held_storages, pick_tied, prepare
from torchdefer.checkpoint._install import Installation
from torchdefer.checkpoint._module_rules import kept_keys
from torchdefer.checkpoint._plan import (
    LoadResult,
    check_devices,
    check_entries,
    plan_keys,
    work_list,
)
from torchdefer.checkpoint._source import CheckpointSource, Source, open_checkpoint
from torchdefer.checkpoint._targets import tensor_groups
from torchdefer.errors import CheckpointUsageError
from torchdefer.materialize._api import deferred_reached, materialized_nbytes, replay_tensors
from torchdefer.materialize._convert import check_dtype
from torchdefer.materialize.progress import Progress, ProgressSpec
from torchdefer.recorder._target import target_of
from torchdefer.recorder._tensor import DeferredTensor, holds_deferred

__all__ = ["is_dcp_checkpoint", "load_state_dict", "loaded_nbytes", "open_source"]


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
    copied into. The whole checkpoint is checked before anything is assigned:
    a load that raises leaves the module as it was.

    Args:
        module: a module built by :func:`torchdefer.deferred_init` (or partly real).
        source: a state dict; a ``.safetensors`` file or a directory of them
            (Hugging Face layout, sharded or not); a ``torch.save`` file; or a
            ``torch.distributed.checkpoint`` directory. Modules sharded with
            FSDP2 ``fully_shard`` or DTensor take any of these: each rank
            keeps only its shard. Files are never run: ``torch.save`` files
            are read ``weights_only``, DCP metadata through an allowlist.
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

    Raises:
        torchdefer.checkpoint.CheckpointError: the file is missing, damaged,
            unsafe, or does not fit the module (subclasses keep the built-in
            types ``FileNotFoundError``, ``ValueError``, ``KeyError``, ...).

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
    device = _check_arguments(device, dtype)
    groups = tensor_groups(module)
    if _is_sharded(groups):
        # torchdefer.distributed's loader: the checkpoint package never imports it.
        loaded: LoadResult = DISTRIBUTED_LOADER.get()(
            module, source, strict=strict, device=device, dtype=dtype,
            materialize_missing=materialize_missing, progress=progress)
        return loaded
    checkpoint = open_source(source)
    result = plan_keys(groups, checkpoint, strict, kept_keys(module, checkpoint.versions))
    work = work_list(groups, checkpoint)
    check_entries(work, checkpoint)
    check_devices(groups, {id(g.tensor) for g, _ in work}, device, materialize_missing)
    changes = Installation()
    values, pages = _read_mapped(work, checkpoint)
    try:
        held = held_storages(g.tensor for g in groups)
        for group, real in _prepare_all(work, checkpoint, values, device, dtype, progress, held):
            changes.stage_loaded(group.tensor, real, group.path)
        del values
        views = _stage_missing(module, changes, work, device, dtype, progress) \
            if materialize_missing else {}
        changes.commit(then=(lambda: _install_views(module, views, device, dtype))
                       if views else None)
    except BaseException:
        pages.cancel()  # a refused load maps no more of the file, and leaves no thread
        raise
    pages.wait()  # the pages are mapped when load_state_dict returns
    return result


def _read_mapped(work, checkpoint: CheckpointSource):
    """A checkpoint whose tensors are views of mapped files (safetensors): every
    tensor at once (no data is read), and their pages mapped by a thread while
    the load goes on (``_pages``). Returns ``(values or None, page mapper)``."""
    if not checkpoint.mapped:
        return None, _pages.map_pages(())
    values = {n: checkpoint.read(n) for _, names in work for n in names}
    return values, _pages.map_pages(values.values())


def _stage_missing(module: nn.Module, changes: Installation, work, device, dtype,
                   progress, staged: frozenset[int] = frozenset()) -> dict[str, DeferredTensor]:
    """Replay what the checkpoint lacks and stage it, before anything is installed
    (a replay that fails changes nothing). Returns the missing tensors that are
    views of loaded ones: eager's show the loaded values, so they are rebuilt
    once those are in (:func:`_install_views`). ``staged``: ids of storages
    whose real replacement the caller staged already (a sharded load's local
    shards and FSDP2's padded flat shards): nothing on them is replayed."""
    loaded = {id(g.tensor) for g, _ in work}
    storages = {id(target_of(g.tensor).storage) for g, _ in work
                if isinstance(g.tensor, DeferredTensor)}
    found, grads = deferred_reached(module)
    now: dict[str, DeferredTensor] = {}
    views: dict[str, DeferredTensor] = {}
    for name, fake in found.items():
        storage = id(target_of(fake).storage)
        if storage in staged:
            continue
        if id(fake) not in loaded:
            (views if storage in storages else now)[name] = fake
    for name, fake, real in replay_tensors(module, now, device, dtype, progress):
        changes.stage_replayed(fake, real, name)
    changes.stage_grads(grads)
    return views


def _install_views(module: nn.Module, views: dict[str, DeferredTensor], device, dtype) -> None:
    """The missing views of loaded tensors, over the loaded tensors now in place."""
    inner = Installation()
    for name, fake, real in replay_tensors(module, views, device, dtype, False):
        inner.stage_replayed(fake, real, name)
    inner.commit()


def _check_arguments(device: torch.device | str | None,
                     dtype: torch.dtype | None) -> torch.device | None:
    try:
        check_dtype(dtype)
        return None if device is None else torch.device(device)
    except (TypeError, RuntimeError) as e:  # a bad dtype; torch.device("gpu")
        raise CheckpointUsageError(f"load_state_dict: {e}") from None


def _prepare_all(work, checkpoint: CheckpointSource, values, device, dtype, progress, held):
    """Read, check ties, convert and lay out every tensor; nothing is installed yet.

    ``values``: the tensors already read, if they were (:func:`_read_mapped`);
    ``held``: the storages of the module's real tensors (:func:`held_storages`)."""
    ready = []
    taken: set = set(held)
    if values is None and checkpoint.read_all is not None:
        values = checkpoint.read_many([n for _, names in work for n in names])
    total = sum(loaded_nbytes(g.tensor, dtype) for g, _ in work)
    with Progress("load", len(work), total, progress) as bar:
        for group, names in work:
            got = values if values is not None else {n: checkpoint.read(n) for n in names}
            loaded = pick_tied(group, names, got, checkpoint.where)
            real = prepare(group, loaded, device, dtype, taken)
            del loaded, got
            ready.append((group, real))
            bar.advance(names[0], real.nbytes)
    return ready


def open_source(source: Source) -> CheckpointSource:
    """The source for ``source``: a DCP directory, or what :func:`open_checkpoint` opens."""
    if is_dcp_checkpoint(source):
        from torchdefer.checkpoint._dcp import open_dcp

        return open_dcp(Path(source))  # type: ignore[arg-type]
    return open_checkpoint(source)


def is_dcp_checkpoint(source: object) -> bool:
    """Whether ``source`` is a ``torch.distributed.checkpoint`` directory (has ``.metadata``)."""
    if isinstance(source, (str, Path)) or hasattr(source, "__fspath__"):
        path = Path(source)
        return path.is_dir() and path.joinpath(".metadata").exists()
    return False


def loaded_nbytes(tensor: torch.Tensor, dtype: torch.dtype | None) -> int:
    """The bytes :func:`prepare` leaves for ``tensor``: a deferred one takes
    ``dtype``, a real one is copied into as it is."""
    if isinstance(tensor, DeferredTensor):
        return materialized_nbytes(tensor, dtype)
    return tensor.numel() * tensor.element_size()


def _is_sharded(groups) -> bool:
    """Whether a parameter or buffer wraps deferred tensors (DTensor, FSDP2)."""
    return any(not isinstance(g.tensor, DeferredTensor) and holds_deferred(g.tensor)
               for g in groups)
