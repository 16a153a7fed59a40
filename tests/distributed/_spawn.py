"""Run scenario functions on N gloo ranks (CPU) in one spawn; collect what each rank saw.

Starting processes is the slow part on a 2-core CI machine, so each world size
spawns once and runs every scenario; each test then reads its scenario's
outcome. A scenario is a function ``(rank, world_size) -> None`` in
``scenarios.py`` that raises on any mismatch with eager PyTorch.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
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
    saved = {name: os.environ.get(name) for name in _WORKER_ENV}
    os.environ.update(_WORKER_ENV)
    try:
        crash = _spawn(world_size, names, out_dir, module)
        if crash is not None:
            # A rank killed by a signal (an abort in gloo's C++, "terminate called
            # without an active exception": seen 2026-11-25 and 2026-11-26, about 1
            # in 4 full runs on the 2-core CI machine, never in isolation), another
            # process taking the port between _free_port() and the store's bind, or
            # gloo's transport closing a pair (_TRANSPORT_FLAKES): a flake of the
            # machine gets one more spawn; a crash (or hang) of ours fails again.
            warnings.warn(f"{world_size}-rank spawn: {crash}; spawned again", stacklevel=2)
            again = _spawn(world_size, names, out_dir, module)
            if again is not None:
                raise RuntimeError(f"{world_size}-rank spawn failed twice:\n{crash}\n"
                                   f"then:\n{again}")
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


def _spawn(world_size: int, names: list[str], out_dir: Path, module: str) -> str | None:
    """Run the ranks; None when every rank ended, else what killed the spawn (a flake).

    A rank's Python exception outside a scenario is raised (with every rank's last
    words); a rank killed by a signal,
    or a port taken before the store bound it, is returned with each rank's last
    scenario and the Python stacks its fault handler dumped.
    """
    for rank in range(world_size):
        for suffix in (".json", ".fault"):
            (out_dir / f"rank{rank}{suffix}").unlink(missing_ok=True)
    context = mp.start_processes(
        _worker, args=(world_size, _free_port(), names, str(out_dir), module),
        nprocs=world_size, join=False, start_method="spawn")
    try:
        while not context.join(grace_period=10):  # the others end on their own first
            pass
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as failed:
        codes = [process.exitcode for process in context.processes]
        ours = (-signal.SIGTERM, -signal.SIGKILL)  # what join sends to the ranks left
        report = f"{failed}\n" + "\n".join(
            f"rank {rank}: exit code {code}, {_last_words(out_dir, rank)}"
            for rank, code in enumerate(codes))
        transport = any(words in str(failed) for words in _TRANSPORT_FLAKES)
        if "EADDRINUSE" not in str(failed) and not transport and not any(
                c is not None and c < 0 and c not in ours for c in codes):
            raise RuntimeError(report) from failed
        return report
    return None


def _last_words(out_dir: Path, rank: int) -> str:
    """Which scenario a rank was in, and what its fault handler dumped."""
    report = out_dir / f"rank{rank}.json"
    running = json.loads(report.read_text()).get(_RUNNING) if report.exists() else None
    fault = out_dir / f"rank{rank}.fault"
    dump = fault.read_text().strip() if fault.exists() else ""
    return f"running {running or 'no scenario'}" + (f"; fault handler:\n{dump}" if dump else "")


_RUNNING = "__running__"  # the scenario a rank is in, in its report while it runs
# gloo's transport dropping a pair between the ranks: every rank then fails in a
# collective outside any scenario (seen once, both ranks timed out in the barrier
# between scenarios, with the fuzzer loading both cores; the file alone passed).
_TRANSPORT_FLAKES = ("Application timeout caused pair closure", "Connection closed by peer")


def _worker(
    rank: int, world_size: int, port: int, names: list[str], out_dir: str, module: str
) -> None:
    import importlib
    from datetime import timedelta

    import torch.distributed as dist

    scenarios = importlib.import_module(module)
    # A rank killed by a signal (an abort in C++) leaves its Python stacks here.
    fault = open(Path(out_dir, f"rank{rank}.fault"), "w")  # open until the rank exits
    faulthandler.enable(file=fault, all_threads=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # A rank stuck in a collective its peer never reached fails instead of hanging.
    dist.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120)
    )
    outcome: dict[str, str] = {}
    try:
        outcome[GLOO_AVG_SUMS] = _gloo_avg_sums(world_size)
        for name in names:
            _report(out_dir, rank, {**outcome, _RUNNING: name})
            try:
                getattr(scenarios, name)(rank, world_size)
                outcome[name] = ""
            except BaseException:  # DCP's CheckpointException is not an Exception
                outcome[name] = traceback.format_exc()
            dist.barrier()  # a failing rank must not leave the others in a collective
    finally:
        _report(out_dir, rank, outcome)
        dist.destroy_process_group()


def _report(out_dir: str, rank: int, outcome: dict[str, str]) -> None:
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(outcome))


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
