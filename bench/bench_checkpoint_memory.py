"""Peak memory of loading a checkpoint into a deferred model, and of dtype= at materialization.

Each case runs in its own spawned process (nothing allocated before it) on a
Llama-shaped model (transformers), fp32, with an untied ``lm_head`` that the
checkpoint lacks (a new head):

- ``eager + load_state_dict``: the baseline users have: build eagerly, load
  the safetensors file with ``Module.load_state_dict(strict=False)``;
- ``deferred + torchdefer.load_state_dict``: the checkpoint is assigned, only
  ``lm_head`` and the rotary buffers are materialized. Expected peak: the
  checkpoint + the missing tensors + one tensor;
- ``eager fp32 then .to(bfloat16)``: the baseline for a dtype change;
- ``deferred, materialize_module(dtype=bfloat16)``: expected peak: the model
  in bf16 + one tensor in fp32;
- ``deferred, model.half() recorded, materialize_module``: the same bound in
  fp16: recorded conversions are replayed tensor by tensor.

Peak = the kernel's RSS high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs`` right before the measured call) minus RSS then.
glibc serves large blocks by mmap (``MALLOC_MMAP_THRESHOLD_``) so freed
tensors leave RSS at once. The checkpoint file's pages that safetensors maps
count in RSS once read: ``safe_open(...).get_tensor`` returns views of the
file mapped copy-on-write (no copy at all), so the torchdefer case reads every
loaded tensor once inside the measured window, as the baseline's copy does.

Run:  python bench/bench_checkpoint_memory.py [--layers 8 --hidden 1024 --vocab 32000]
Writes bench/results/checkpoint_memory.md (and prints it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench.memory import PeakMeter
from bench.models import llama_for_causal_lm as build

MiB = 1 << 20
RESULTS = Path(__file__).parent / "results" / "checkpoint_memory.md"
CASES = [
    "eager + load_state_dict",
    "deferred + torchdefer.load_state_dict",
    "eager fp32 then .to(bfloat16)",
    "deferred, materialize_module(dtype=bfloat16)",
    "deferred, model.half() recorded, materialize_module",
]


_METER = PeakMeter()


def _reset_peak() -> int:
    return _METER.reset()


def _peak() -> int:
    peak = _METER.peak()
    if peak is None:
        raise RuntimeError("no VmHWM")
    return peak


def _case(case: str, shape: tuple[int, int, int], checkpoint: str, out: str) -> None:
    import safetensors.torch

    import torchdefer

    torch.manual_seed(0)
    base = _reset_peak()
    start = time.perf_counter()
    if case == "eager + load_state_dict":
        model = build(*shape)
        model.load_state_dict(safetensors.torch.load_file(checkpoint), strict=False)
    elif case == "deferred + torchdefer.load_state_dict":
        model = torchdefer.deferred_init(build, *shape)
        base = _reset_peak()
        start = time.perf_counter()
        torchdefer.load_state_dict(model, checkpoint, progress=False)
        # safetensors maps the file copy-on-write: the loaded tensors are its
        # pages, read in lazily. Read every tensor once so they are all counted.
        _touch(model)
    elif case == "eager fp32 then .to(bfloat16)":
        model = build(*shape).to(torch.bfloat16)
    elif case == "deferred, materialize_module(dtype=bfloat16)":
        model = torchdefer.deferred_init(build, *shape)
        base = _reset_peak()
        start = time.perf_counter()
        torchdefer.materialize_module(model, dtype=torch.bfloat16, progress=False)
    else:
        model = torchdefer.deferred_init(build, *shape)
        model.half()
        base = _reset_peak()
        start = time.perf_counter()
        torchdefer.materialize_module(model, progress=False)
    seconds = time.perf_counter() - start
    peak = _peak() - base
    assert not torchdefer.is_deferred(model)
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}.values()
    final = sum(t.numel() * t.element_size() for t in tensors)
    largest_fp32 = max(t.numel() * 4 for t in tensors)
    Path(out, f"{CASES.index(case)}.json").write_text(json.dumps(
        dict(case=case, peak=peak, final=final, largest_fp32=largest_fp32, seconds=seconds)))


def _touch(model) -> None:
    for t in model.state_dict().values():
        float(t.float().sum() if t.is_floating_point() else t.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    shape = (args.layers, args.hidden, args.vocab)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by each spawned process at start
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = tempfile.mkdtemp()
    checkpoint = str(Path(out, "model.safetensors"))
    ctx = mp.get_context("spawn")
    saver = ctx.Process(target=_save, args=(shape, checkpoint))
    saver.start()
    saver.join()
    for case in CASES:
        p = ctx.Process(target=_case, args=(case, shape, checkpoint, out))
        p.start()
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"case {case!r} failed (exit code {p.exitcode})")
    rows = [json.loads(Path(out, f"{i}.json").read_text()) for i in range(len(CASES))]
    report = _report(rows, shape, os.path.getsize(checkpoint))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    print(report)


def _save(shape: tuple[int, int, int], checkpoint: str) -> None:
    import safetensors.torch

    torch.manual_seed(1)
    state = build(*shape).state_dict()
    del state["lm_head.weight"]  # the checkpoint lacks the head: a new one is initialized
    safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()}, checkpoint)


def _report(rows: list[dict], shape: tuple[int, int, int], checkpoint: int) -> str:
    eager_load, load, eager_cast, cast, half = rows
    missing = load["final"] - checkpoint
    bounds = {
        load["case"]: checkpoint + missing + load["largest_fp32"],
        cast["case"]: cast["final"] + cast["largest_fp32"],
        half["case"]: half["final"] + half["largest_fp32"],
    }
    lines = [
        "# Peak memory of checkpoint loading and dtype= at materialization",
        "",
        f"Llama-shaped model (transformers), {shape[0]} layers, hidden {shape[1]}, vocab "
        f"{shape[2]}, fp32, untied lm_head absent from the checkpoint "
        f"({checkpoint / MiB:.1f} MiB safetensors file; missing tensors "
        f"{missing / MiB:.1f} MiB). torch {torch.__version__}, {platform.machine()}, "
        f"{os.cpu_count()} cores, python {sys.version.split()[0]}.",
        "",
        "`peak` is the RSS high-water mark during the call minus RSS before it; `bound` is "
        "what the issue asks for: checkpoint + missing tensors + one (the largest, fp32) "
        "tensor when loading; the converted model + one fp32 tensor for a dtype change. "
        "Ratios are against the eager baseline of the same run. Produced by "
        "`python bench/bench_checkpoint_memory.py`.",
        "",
        "| case | final model (MiB) | bound (MiB) | peak (MiB) | peak / bound | "
        "peak / eager baseline | time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row, baseline in ((eager_load, eager_load), (load, eager_load),
                          (eager_cast, eager_cast), (cast, eager_cast), (half, eager_cast)):
        bound = bounds.get(row["case"])
        bound_text = "-" if bound is None else f"{bound / MiB:.1f}"
        ratio_text = "-" if bound is None else f"{row['peak'] / bound:.2f}"
        lines.append(
            f"| {row['case']} | {row['final'] / MiB:.1f} | {bound_text} | "
            f"{row['peak'] / MiB:.1f} | {ratio_text} | "
            f"{row['peak'] / baseline['peak']:.2f} | {row['seconds']:.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
