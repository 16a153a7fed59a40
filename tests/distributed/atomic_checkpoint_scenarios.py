"""Sharded loads are all or nothing on every rank (see test_sharded_checkpoint_all_or_nothing.py).

Each scenario is ``(rank, world_size) -> None``. A failure is injected on one
rank (the first, then the last) at each point where a load can fail: reading
a tensor, before and after ``dcp.load``, a swap of a plain tensor, the
install of a shard, the replay of a missing shard or of a missing plain
buffer. The failing rank must raise its own error, every other rank
``CheckpointRankError``, and every rank's model must be unchanged, tensor by
tensor (DTensor local shards and FSDP2's flat shards included: object,
deferred-ness, storage, bits). A following good load must match eager.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import torchdefer
import torchdefer.checkpoint._dcp as dcp_module
import torchdefer.checkpoint._install as install_module
import torchdefer.distributed
import torchdefer.distributed._load as checkpoint_module
import torchdefer.distributed._staged as staged_module
import torchdefer.materialize._api as api_module
from torchdefer.checkpoint import CheckpointFormatError, CheckpointRankError
from torchdefer.distributed._module import _fsdp2_params

ALL = [
    "a_failure_on_one_rank_leaves_every_rank_unchanged_full_source",
    "a_failure_on_one_rank_leaves_every_rank_unchanged_dcp_source",
    "a_failure_on_one_rank_leaves_real_plain_tensors_unchanged",
    "a_materialized_sharded_model_is_refused_unchanged",
]


class Injected(RuntimeError):
    pass


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
        self.norm = nn.BatchNorm1d(8)  # parameters sharded; buffers plain
        self.head = nn.Linear(8, 4)
        self.register_buffer("scale", torch.rand(8))  # a plain persistent buffer


def _shard(model: nn.Module) -> None:
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)


def _deferred() -> nn.Module:
    torch.manual_seed(0)
    model = torchdefer.deferred_init(Net)
    _shard(model)
    return model


def _state(seed: int = 1, drop: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v for k, v in Net().state_dict().items() if k not in drop}


def _eager(state) -> nn.Module:
    torch.manual_seed(0)
    eager = Net()
    eager.load_state_dict(state, strict=False)
    return eager


def _snapshot(model: nn.Module) -> dict:
    out = {}
    tensors = [*model.named_parameters(remove_duplicate=False),
               *model.named_buffers(remove_duplicate=False)]
    for i, fsdp_param in enumerate(_fsdp2_params(model)):
        tensors.append((f"flat shard {i}", fsdp_param._sharded_param_data))
    for name, t in tensors:
        local = t._local_tensor if isinstance(t, DTensor) else t
        real = not torchdefer.is_deferred(local)
        bits = local.detach().contiguous().reshape(-1).view(torch.uint8).clone() if real else None
        storage = local.untyped_storage().data_ptr() if real else None
        out[name] = (id(t), id(local), type(local), real, storage, bits)
    return out


def _assert_unchanged(model: nn.Module, before: dict, what: str) -> None:
    after = _snapshot(model)
    assert after.keys() == before.keys(), what
    for name, was in before.items():
        now = after[name]
        assert now[:5] == was[:5], f"{what}: {name} changed object, deferred-ness or storage"
        if was[3]:
            assert torch.equal(now[5], was[5]), f"{what}: {name} changed values"


def _check(model: nn.Module, eager: nn.Module) -> None:
    assert not torchdefer.is_deferred(model)
    gathered = {n: p.full_tensor() for n, p in model.named_parameters()}  # collectives first
    for name, ref in eager.named_parameters():
        assert torch.equal(gathered[name], ref), f"{name} differs from eager"
    for name, ref in eager.named_buffers():
        assert torch.equal(model.get_buffer(name), ref), f"buffer {name} differs"


class _FailsRead(dict):
    """A state dict whose ``key`` cannot be read (a disk error) on one rank."""

    def __init__(self, state, key: str) -> None:
        super().__init__(state)
        self.key = key

    def __getitem__(self, key):
        if key == self.key:
            raise Injected(f"injected read failure of '{key}'")
        return super().__getitem__(key)


@contextlib.contextmanager
def _patched(owner, name: str, fails_on_call: int | None = None, when=None):
    """``owner.<name>`` raising :class:`Injected` at its ``fails_on_call``-th call (0-based,
    ``-1``: the last of a good load) or where ``when(*args)`` holds."""
    original, seen = getattr(owner, name), []

    def failing(*args, **kwargs):
        seen.append(args)
        if (when is not None and when(*args)) or len(seen) - 1 == fails_on_call:
            raise Injected(f"injected failure in {name}")
        return original(*args, **kwargs)

    setattr(owner, name, failing)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def _failing_step(position: int):
    """The ``position``-th staged change of a sharded install (a shard) fails when made."""
    original, count = install_module.Installation.stage_step, []

    def stage_step(self, make, undo_it):
        count.append(None)
        if len(count) - 1 == position:
            def make():  # the failing one replaces it
                raise Injected("injected failure installing a shard")
        return original(self, make, undo_it)

    install_module.Installation.stage_step = stage_step
    try:
        yield
    finally:
        install_module.Installation.stage_step = original


def _expect_refusal(model, load, inject, bad: int, what: str) -> None:
    rank = dist.get_rank()
    before = _snapshot(model)
    try:
        with inject() if rank == bad else contextlib.nullcontext():
            load(model)
    except Injected:
        assert rank == bad, f"{what}: rank {rank} raised the injected error of rank {bad}"
    except CheckpointRankError as e:
        assert rank != bad, f"{what}: the failing rank lost its own error: {e}"
        assert f"rank {bad}" in str(e) and "as it was" in str(e) and "injected" in str(e), e
    except CheckpointFormatError as e:  # inside dcp.load: DCP tells every rank itself
        assert what.startswith("dcp.load"), f"{what}: {e}"
        assert "injected" in str(e), e
    else:
        raise AssertionError(f"{what}: rank {rank} loaded although rank {bad} failed")
    _assert_unchanged(model, before, f"{what}, failing on rank {bad}")


def _full_injections(state):
    """(what, load, inject) for a full state dict source."""
    missing_head = {k: v for k, v in state.items() if not k.startswith("head.")}
    missing_scale = {k: v for k, v in state.items() if k != "scale"}

    def load(source):
        return lambda model: torchdefer.load_state_dict(model, source)

    return [
        ("a read failing", lambda model: torchdefer.load_state_dict(
            model, _FailsRead(state, "head.bias") if dist.get_rank() == _BAD[0] else state),
         contextlib.nullcontext),
        ("the first swap failing", load(state), lambda: _patched(install_module, "exchange", 0)),
        ("the last swap failing", load(state), lambda: _patched(install_module, "exchange", 3)),
        ("the first shard failing", load(state), lambda: _failing_step(0)),
        ("the last shard failing", load(state), lambda: _failing_step(7)),
        ("a missing shard's replay failing", load(missing_head),
         lambda: _patched(staged_module, "replay_local", when=lambda fakes, name: name == "head.bias")),
        ("a missing plain buffer's replay failing", load(missing_scale),
         lambda: _patched(api_module, "_replay", when=lambda fake, device, name: name == "scale")),
    ]


_BAD = [0]  # the rank that fails, for injections that read it while loading


def _each_failure(model, injections) -> None:
    for bad in sorted({0, dist.get_world_size() - 1}):
        _BAD[0] = bad
        for what, load, inject in injections:
            _expect_refusal(model, load, inject, bad, what)


def a_failure_on_one_rank_leaves_every_rank_unchanged_full_source(rank: int, world: int) -> None:
    state = _state()
    model = _deferred()
    _each_failure(model, _full_injections(state))
    good = _state(seed=2, drop=("head.weight", "head.bias", "scale"))
    torchdefer.load_state_dict(model, good)
    _check(model, _eager(good))


def a_failure_on_one_rank_leaves_every_rank_unchanged_dcp_source(rank: int, world: int) -> None:
    path = Path(os.environ["TORCHDEFER_TEST_CHECKPOINTS"], f"atomic-dcp-{world}")
    state = _state()
    if rank == 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(state, checkpoint_id=path, no_dist=True)
    dist.barrier()
    model = _deferred()

    def load(m):
        return torchdefer.load_state_dict(m, path)

    _each_failure(model, [
        ("a shard failing before dcp.load", load,
         lambda: _patched(checkpoint_module, "_stage_shard", 3)),
        ("dcp.load's read failing", load,
         lambda: _patched(dcp_module._SafeReader, "read_data", 0)),
        ("a plain tensor failing after dcp.load", load,
         lambda: _patched(checkpoint_module, "prepare", 2)),
        ("a swap failing", load, lambda: _patched(install_module, "exchange", 1)),
        ("a shard failing", load, lambda: _failing_step(5)),
    ])
    torchdefer.load_state_dict(model, path)
    _check(model, _eager(state))


def a_failure_on_one_rank_leaves_real_plain_tensors_unchanged(rank: int, world: int) -> None:
    """A sharded module whose plain buffers are real already (copied into, last)."""
    state = _state()
    model = _deferred()
    for name in ("scale", "norm.running_mean", "norm.running_var"):
        owner, attr = (model.norm, name.split(".")[1]) if "." in name else (model, name)
        setattr(owner, attr, torch.full((8,), float(rank + 7)))
    real = model.scale
    storage = real.untyped_storage().data_ptr()

    def load(m):
        return torchdefer.load_state_dict(m, state)

    _each_failure(model, [
        ("a swap failing", load, lambda: _patched(install_module, "exchange", 0)),
        ("the last shard failing", load, lambda: _failing_step(7)),
        ("a read failing", lambda m: torchdefer.load_state_dict(
            m, _FailsRead(state, "head.bias") if dist.get_rank() == _BAD[0] else state),
         contextlib.nullcontext),
    ])
    torchdefer.load_state_dict(model, state)
    assert model.scale is real and real.untyped_storage().data_ptr() == storage
    _check(model, _eager(state))


def a_materialized_sharded_model_is_refused_unchanged(rank: int, world: int) -> None:
    """Real DTensors are refused with an error that says what to use instead (copying
    into them raised a bare RuntimeError from DTensor's dispatch before)."""
    model = _deferred()
    torchdefer.distributed.materialize_module(model)
    before = _snapshot(model)
    try:
        torchdefer.load_state_dict(model, _state())
    except torchdefer.checkpoint.CheckpointUsageError as e:
        assert "DTensor" in str(e) and "set_model_state_dict" in str(e), e
    else:
        raise AssertionError("a checkpoint was copied into real DTensors")
    _assert_unchanged(model, before, "materialized sharded model")
