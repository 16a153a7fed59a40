"""Run scenario functions on N gloo ranks (CPU) in one spawn; collect what each rank saw.

Starting processes is the slow part on a 2-core CI machine, so each world size
spawns once and runs every scenario; each test then reads its scenario's
outcome. A scenario is a function ``(rank, world_size) -> None`` in
``scenarios.py`` that raises on any mismatch with eager PyTorch.
"""

from __future__ import annotations

import json
import os
import socket
import traceback
import warnings
from pathlib import Path

import torch.multiprocessing as mp

# A pseudo-scenario each spawn reports: not [] when this torch's gloo
# reduce_scatter returns the sum for ReduceOp.AVG (torch 2.8 does). FSDP2
# averages gradients with it, so a multi-rank step then moves parameters by
# world_size times eager's step, with or without torchdefer.
GLOO_AVG_SUMS = "gloo_reduce_scatter_avg_returns_the_sum"

# What the spawned ranks read at their start:
# - large blocks come from mmap and go back to the OS when freed, so the peak
#   RSS a scenario measures is its own (read by glibc at process start);
# - no GPU: the ranks are CPU gloo ranks. On a GPU host FSDP2's default mesh
#   would put every rank's shards on the one cuda:0 (seen on an H200: the
#   scenarios compared CUDA shards with CPU tensors, and ranks crashed).
_WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "CUDA_VISIBLE_DEVICES": ""}


def run_scenarios(
    world_size: int, names: list[str], out_dir: Path, module: str = "scenarios"
) -> dict[str, list[str]]:
    """{scenario: [error traceback per failing rank]} (an empty list means it passed).

    ``module`` is the file (next to this one) that defines the scenarios.
    """
    port = _free_port()
    saved = {name: os.environ.get(name) for name in _WORKER_ENV}
    os.environ.update(_WORKER_ENV)
    def spawn(port: int) -> None:
        mp.spawn(_worker, args=(world_size, port, names, str(out_dir), module),
                 nprocs=world_size)

    try:
        try:
            spawn(port)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as failed:
            # Flakes of the machine, not of ours, get one more spawn (a crash of
            # ours fails again); the first is kept as a warning:
            # - another process took the free port between _free_port() and the
            #   store's bind (seen 2026-11-26 with other test runs in parallel);
            # - a rank aborting in gloo's C++ ("terminate called without an active
            #   exception"; seen once on 2026-11-25, 1 of 4 full runs on the 2-core
            #   machine, not reproduced in isolation).
            flake = ("EADDRINUSE" in str(failed)
                     if isinstance(failed, mp.ProcessRaisedException)
                     else failed.signal_name is not None)
            if not flake:
                raise
            warnings.warn(f"{world_size}-rank spawn: {failed}; spawned again", stacklevel=2)
            spawn(_free_port())
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    results: dict[str, list[str]] = {name: [] for name in [*names, GLOO_AVG_SUMS]}
    for rank in range(world_size):
        outcome = json.loads((out_dir / f"rank{rank}.json").read_text())
        for name in [*names, GLOO_AVG_SUMS]:
            error = outcome.get(name, "scenario did not report (the rank died?)")
            if error:
                results[name].append(f"rank {rank}/{world_size}:\n{error}")
    return results


def _worker(
    rank: int, world_size: int, port: int, names: list[str], out_dir: str, module: str
) -> None:
    import importlib
    from datetime import timedelta

    import torch.distributed as dist

    scenarios = importlib.import_module(module)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # A rank stuck in a collective its peer never reached fails instead of hanging.
    dist.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120)
    )
    outcome: dict[str, str] = {}
    try:
        outcome[GLOO_AVG_SUMS] = _gloo_avg_sums(world_size)
        for name in names:
            try:
                getattr(scenarios, name)(rank, world_size)
                outcome[name] = ""
            except Exception:
                outcome[name] = traceback.format_exc()
            dist.barrier()  # a failing rank must not leave the others in a collective
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(outcome))
        dist.destroy_process_group()


def _gloo_avg_sums(world_size: int) -> str:
    import torch
    import torch.distributed as dist

    out = torch.empty(1)
    dist.reduce_scatter_tensor(out, torch.ones(world_size), op=dist.ReduceOp.AVG)
    if out.item() == 1.0:
        return ""
    return f"reduce_scatter_tensor(op=AVG) of ones gave {out.item()} on gloo (torch {torch.__version__})"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
