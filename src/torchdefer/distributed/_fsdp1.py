"""FSDP1 (``FullyShardedDataParallel``): materialize each wrapped unit as FSDP1 builds it.

FSDP1 materializes a unit before flattening it when the unit is "deferred",
and it has exactly two tests for that, both in
``torch.distributed.fsdp._init_utils._need_to_materialize_module``: a
parameter or buffer ``is_meta``, or torchdistX's ``fake.is_fake``. A torchdefer
tensor passes neither, by design: it reports the real device it will have
(promise 2), so ``is_meta`` is False, and torchdistX is a different package.
Left alone, FSDP1 would never call ``param_init_fn`` and would flatten fake
tensors.

:func:`fsdp1_deferred_init` teaches that test about torchdefer for the
duration of a ``with`` block (the original is put back in ``finally``;
nothing is patched at import). Inside it FSDP1 calls ``param_init_fn`` on
each module of each unit, or, without ``param_init_fn``, takes its torchdistX
path with torchdefer standing in for torchdistX.

FSDP1 materializes a whole unit before sharding it, so the peak per rank is
one unit unsharded (plus the shards so far); FSDP2 with
:func:`torchdefer.distributed.materialize_module` needs only one parameter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from torchdefer import _compat
from torchdefer._compat.patch import attribute, patched
from torchdefer.errors import UnsupportedError
from torchdefer.materialize import materialize_module as materialize_plain
from torchdefer.recorder import DeferredTensor

__all__ = ["fsdp1_deferred_init", "param_init_fn"]


def param_init_fn(module: nn.Module) -> None:
    """Materialize ``module``'s own deferred parameters and buffers (not its children's).

    Pass it as ``FullyShardedDataParallel(..., param_init_fn=param_init_fn)``
    inside :func:`fsdp1_deferred_init`; FSDP1 calls it once per module of each
    wrapped unit, then flattens and shards the real tensors. Values are those
    of eager construction with the same seed; tensors are created on their
    recorded device, and FSDP1 then moves them to ``device_id``.

    Args:
        module: one module of an FSDP1 unit, built by :func:`torchdefer.deferred_init`.

    Example, run on each rank (``torchrun --nproc-per-node 2 this.py``)::

        import torch, torchdefer
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torchdefer.distributed import fsdp1_deferred_init, param_init_fn

        torch.distributed.init_process_group("gloo")
        torch.manual_seed(0)  # the same seed on every rank
        model = torchdefer.deferred_init(torch.nn.Linear, 8, 8)
        with fsdp1_deferred_init():
            model = FSDP(model, param_init_fn=param_init_fn, device_id=torch.device("cpu"))
        assert not torchdefer.is_deferred(model)
    """
    materialize_plain(module, check_fn=lambda sub: sub is module)


@contextlib.contextmanager
def fsdp1_deferred_init() -> Iterator[None]:
    """Make ``FullyShardedDataParallel(...)`` materialize torchdefer modules, in this block.

    Inside the block, FSDP1 treats a unit with deferred parameters or buffers
    as one to materialize: it calls ``param_init_fn`` if given (use
    :func:`param_init_fn`), else materializes the unit like
    ``materialize_module(unit, check_fn=...)``. Modules on the meta device and
    torchdistX modules are handled as before. Not thread-safe: do not build
    FSDP1 models from two threads at once inside it.

    Example::

        with torchdefer.distributed.fsdp1_deferred_init():
            model = FSDP(deferred_model, auto_wrap_policy=policy,
                         param_init_fn=torchdefer.distributed.param_init_fn)

    Raises:
        UnsupportedError: (a ``RuntimeError``) this PyTorch's FSDP1 no longer has the
            hook it relies on.
    """
    _init_utils = _compat.fsdp1_init_utils()

    original = getattr(_init_utils, "_need_to_materialize_module", None)
    if original is None:
        raise UnsupportedError(
            "torchdefer.distributed.fsdp1_deferred_init relies on "
            "torch.distributed.fsdp._init_utils._need_to_materialize_module, which this "
            "PyTorch build does not have. Use FSDP2 (fully_shard) with "
            "torchdefer.distributed.materialize_module instead."
        )

    def need_to_materialize(module, ignored_params, ignored_modules) -> tuple[bool, bool]:
        is_meta, is_torchdistx = original(module, ignored_params, ignored_modules)
        if is_meta or is_torchdistx:
            return is_meta, is_torchdistx
        return False, _has_deferred(module, ignored_params, ignored_modules, _init_utils)

    previous_shim = getattr(_init_utils, "deferred_init", None)
    with patched(attribute(_init_utils, "_need_to_materialize_module"), need_to_materialize), \
            patched(attribute(_init_utils, "deferred_init"), _TorchdistxStandIn(previous_shim)):
        yield


class _TorchdistxStandIn:
    """What FSDP1 calls as ``torchdistx.deferred_init`` when no param_init_fn is given."""

    def __init__(self, torchdistx: Any) -> None:
        self.torchdistx = torchdistx  # the real module, if installed: its modules go there

    def materialize_module(
        self, module: nn.Module, check_fn: Callable[[nn.Module], bool] | None = None
    ) -> nn.Module:
        if self.torchdistx is not None and not _owns_deferred(module):
            return self.torchdistx.materialize_module(module, check_fn=check_fn)
        return materialize_plain(module, check_fn=check_fn)


def _has_deferred(module, ignored_params, ignored_modules, init_utils) -> bool:
    params = init_utils._get_orig_params(module, ignored_params)
    if any(isinstance(p, DeferredTensor) for p in params):
        return True
    return any(
        isinstance(b, DeferredTensor)
        for sub in module.modules()
        if sub not in ignored_modules
        for b in sub.buffers(recurse=False)
    )


def _owns_deferred(module: nn.Module) -> bool:
    return any(isinstance(t, DeferredTensor) for t in (*module.parameters(), *module.buffers()))
