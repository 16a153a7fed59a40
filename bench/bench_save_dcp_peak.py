"""Peak memory of save_state_dict(format="dcp") against replaying one tensor at a time.

The model is a stack of ``--layers`` equal ``Linear(--width, --width)`` layers
(fp32, no bias; 576 MiB each by default): tensors larger than the writer's
256 MiB slack, and consecutive, so a writer that keeps the tensor it wrote
while the next one is made shows a peak of two tensors. Each case runs in its
own spawned process, seed 0:

- ``generate``: the baseline; every tensor replayed in turn and dropped;
- ``dcp``: ``save_state_dict(model, dir, format="dcp")``;
- ``dcp bf16``: the same with ``dtype=torch.bfloat16`` (the converted copy of
  the tensor being converted is alive beside it: DCP's files hold whole
  ``torch.save``'d tensors);
- ``safetensors bf16``: ``save_state_dict(model, dir, dtype=torch.bfloat16)``
  (converts piece by piece).

Peak = the kernel's RSS high-water mark (``VmHWM``, reset right before the
call) minus RSS then, as in bench_save_init.py. The values are checked: the DCP
directory is read back with ``dcp.load`` and compared with the replayed tensors.

Run:  nice python bench/bench_save_dcp_peak.py [--width 12288 --layers 4]
Writes bench/results/save_init_dcp_peak.md (and prints it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench.memory import PeakMeter

MiB = 1 << 20
RESULTS = Path(__file__).parent / "results" / "save_init_dcp_peak.md"
CASES = ["generate", "dcp", "dcp bf16", "safetensors bf16"]
_METER = PeakMeter()


def _model(width: int, layers: int):
    import torchdefer

    torch.manual_seed(0)
    return torchdefer.deferred_init(lambda: torch.nn.Sequential(
        *[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]))


def _case(case: str, width: int, layers: int, out: str, result: str) -> None:
    import warnings

    import torchdefer
    from torchdefer.materialize._value import replay_value

    warnings.filterwarnings("ignore")
    model = _model(width, layers)
    base = _METER.reset()
    start = time.perf_counter()
    if case == "generate":
        for name, param in model.named_parameters():
            value = replay_value(param, name)
            del value
    else:
        torchdefer.save_state_dict(
            model, out, format="dcp" if case.startswith("dcp") else "safetensors",
            dtype=torch.bfloat16 if case.endswith("bf16") else None, progress=False)
    seconds = time.perf_counter() - start
    peak = _METER.peak() - base
    equal = None
    if case == "dcp":
        equal = _check(model, out)
    Path(result).write_text(json.dumps(dict(case=case, seconds=seconds, peak=peak, base=base,
                                            equal=equal, load=os.getloadavg()[0])))


def _check(model, out: str) -> bool:
    """dcp.load of the directory equals each replayed tensor (one at a time)."""
    import torch.distributed.checkpoint as dcp

    from torchdefer.materialize._value import replay_value

    for name, param in model.named_parameters():
        state = {name: torch.empty(param.shape)}
        dcp.load(state, checkpoint_id=out, no_dist=True)
        if not torch.equal(state[name], replay_value(param, name)):
            return False
    return True


def _spawn(*args) -> dict:
    result = Path(tempfile.mkdtemp()) / "result.json"
    process = mp.get_context("spawn").Process(target=_case, args=(*args, str(result)))
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"{args[0]} failed with exit code {process.exitcode}")
    return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=12288)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--scratch", default=None)
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # freed tensors leave RSS at once
    scratch = Path(tempfile.mkdtemp(dir=args.scratch))
    rows = []
    try:
        for case in CASES:
            out = scratch / case.replace(" ", "-")
            rows.append(_spawn(case, args.width, args.layers, str(out)))
            print(rows[-1], flush=True)
            shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = _report(args, rows)
    Path(args.results).write_text(report)
    print(report)


def _report(args, rows: list[dict]) -> str:
    tensor = args.width * args.width * 4
    base = rows[0]["peak"]
    command = (f"nice python bench/bench_save_dcp_peak.py --width {args.width} "
               f"--layers {args.layers}")
    loads = [r["load"] for r in rows]
    lines = [
        "# save_state_dict(format='dcp'): peak memory",
        "",
        f"{args.layers} x Linear({args.width}, {args.width}, bias=False), fp32: "
        f"{tensor / MiB:,.0f} MiB per tensor. torch {torch.__version__}, "
        f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs (1-minute "
        f"load average {min(loads):.0f} to {max(loads):.0f}), python {sys.version.split()[0]}.",
        "",
        f"Produced by `{command}`; each case in its own process. Peak = VmHWM above the RSS "
        "before the call.",
        "",
        "| case | wall (s) | peak above base (MiB) | peak / one tensor | peak / generate |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['case']} | {r['seconds']:.1f} | {r['peak'] / MiB:,.0f} | "
                     f"{r['peak'] / tensor:.2f} | {r['peak'] / base:.2f} |")
    dcp = next(r for r in rows if r["case"] == "dcp")
    lines += ["", f"- **Values**: dcp.load of the `dcp` directory equals every replayed "
                  f"tensor: {dcp['equal']}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
