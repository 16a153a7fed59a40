"""Parallel CPU materialization (issue 23, item 1): time, peak memory and bits per thread count.

Each case runs in its own spawned process on a Llama-shaped ``transformers``
model from the bench zoo (``bench/models.py``; default ``llama-1b``, Llama 3.2
1B: 1.24B parameters, fp32), seed 0, in turns over ``--repeat`` rounds:

- ``eager``: ``LlamaForCausalLM(config)``, what users do today (``nn.Linear``'s
  kaiming ``uniform_`` and then Hugging Face's ``normal_`` on every weight);
- ``threads=T``: ``deferred_init`` (not timed), then
  ``materialize_module(model, threads=T)`` timed (the ``uniform_`` hidden by the
  ``normal_`` after it is never drawn; each large fill is drawn in ``T``
  chunks, each from its own jumped generator state, and the smaller tensors
  are replayed up to ``T`` at a time (``materialize.concurrent``, the
  default);
- ``threads=T serial`` (``--threads T-serial``): the same with one tensor at
  a time (``materialize.concurrent.budget(0)``).

Every case fingerprints its weights bit for bit (``bench/fingerprint.py``) and
the report says whether all equal eager's. Peak = the kernel's RSS high-water
mark (``VmHWM``, reset right before the timed call) minus RSS then. Targets
(issue 23): 2 threads <= 0.6x the 1-thread time and <= 0.35x eager; peak
within 5% of the 1-thread peak.

Then, in this process, the numbers for the 64-core model on paper: mt19937
words/s on one core, ``normal_``'s bytes/s on one core, the machine's write
bandwidth on 1 and on all cores, a jump's cost (power of x known or new), and
the chunk threshold: ``materialize_tensor`` of one ``normal_`` call with 1 and
2 threads across sizes (``parallel.min_chunk`` lowered to split them all).

The machine is shared: run it when it is quiet. One command, which writes
``bench/results/parallel.md`` (and prints it):

    nice python bench/bench_parallel.py --repeat 3

The quick check of the targets (threads 1 and 2 against eager, ~2-3 min on
an idle 2-core machine; writes the same file)::

    nice python bench/bench_parallel.py --repeat 3 --quick

A short run (2 layers, fewer sizes): ``--model llama-1b-L2 --repeat 1``.

Independent tensors side by side: a model whose every tensor is below the
split size (Llama 125M: 0.6M-1.6M-element projections, one 24.6M embedding),
against one tensor at a time::

    nice python bench/bench_parallel.py --model llama-125m --threads 1,2-serial,2 \
        --repeat 5 --out bench/results/parallel_tensors.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench.fingerprint import fingerprint
from bench.memory import PeakMeter
from bench.models import build_fn, spec_named

MiB = 1 << 20
RESULTS = Path(__file__).parent / "results" / "parallel.md"
_METER = PeakMeter()


def _case(case: str, model_name: str, result: str) -> None:
    import torchdefer

    fn, args = build_fn(spec_named(model_name))
    torch.manual_seed(0)
    if case == "eager":
        base = _METER.reset()
        cpu, start = _cpu(), time.perf_counter()
        model = fn(*args)
    else:
        from torchdefer.materialize import concurrent

        model = torchdefer.deferred_init(fn, *args)
        threads, _, serial = case.split("=")[1].partition(" ")
        # "threads=T serial": one tensor at a time (concurrent.budget(0));
        # "threads=T": tensors side by side (materialize.concurrent, the default).
        one_at_a_time = concurrent.budget(0) if serial else contextlib.nullcontext()
        base = _METER.reset()
        cpu, start = _cpu(), time.perf_counter()
        with one_at_a_time:
            torchdefer.materialize_module(model, threads=int(threads), progress=False)
    seconds = time.perf_counter() - start
    cpu = _cpu() - cpu
    peak = _METER.peak() - base
    params = sum(p.numel() for p in model.parameters())
    Path(result).write_text(json.dumps(dict(
        case=case, seconds=seconds, cpu=cpu, peak=peak, base=base, params=params,
        fingerprint=fingerprint(model), load=os.getloadavg()[0])))


def _cpu() -> float:
    """CPU seconds of this process, all threads (user + system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _spawn(case: str, model_name: str) -> dict:
    result = tempfile.mktemp(suffix=".json")
    p = mp.get_context("spawn").Process(target=_case, args=(case, model_name, result))
    p.start()
    p.join()
    if p.exitcode != 0:
        raise SystemExit(f"case {case} failed (exit code {p.exitcode})")
    out = json.loads(Path(result).read_text())
    os.unlink(result)
    return out


# ---------------------------------------------------------------- the 64-core model


def _rate(fn, repeat: int = 3) -> float:
    """Best seconds of ``fn()`` over ``repeat`` calls (after one warm-up)."""
    fn()
    return min(_timed(fn) for _ in range(repeat))


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _one_core_rates(elements: int) -> dict:
    """Generator words/s, normal_ and uniform_ bytes/s, write bandwidth: one core."""
    from torchdefer.rng import mt19937

    g = torch.Generator().manual_seed(0)
    words = torch.empty(elements, dtype=torch.int32)
    floats = torch.empty(elements, dtype=torch.float32)
    with mt19937.one_thread():
        mt_s = _rate(lambda: words.random_(generator=g))
        normal_s = _rate(lambda: floats.normal_(generator=g))
        uniform_s = _rate(lambda: floats.uniform_(generator=g))
        fill_s = _rate(lambda: floats.fill_(1.5))
    return dict(mt_words_per_s=elements / mt_s, normal_bytes_per_s=4 * elements / normal_s,
                uniform_bytes_per_s=4 * elements / uniform_s,
                fill_bytes_per_s_1core=4 * elements / fill_s)


def _all_core_fill(elements: int) -> float:
    """Write bandwidth with every core writing (torch's intra-op fill_)."""
    floats = torch.empty(elements, dtype=torch.float32)
    return 4 * elements / _rate(lambda: floats.fill_(2.5))


def _jump_costs() -> dict:
    """A jump whose power of x is new, and the same distance again (power known)."""
    from torchdefer.rng import mt19937

    state = torch.Generator().manual_seed(1).get_state()
    distance = mt19937.N * 7_777_777
    mt19937._warm.discard(distance // mt19937.N)
    new = _timed(lambda: mt19937.advance(state, distance))
    known = min(_timed(lambda: mt19937.advance(state, distance)) for _ in range(5))
    return dict(jump_new_s=new, jump_known_s=known)


def _threshold(sizes: list[int], repeat: int) -> list[dict]:
    """One normal_ of n float32 elements, materialized with 1 and 2 threads, split at any size."""
    import torchdefer
    from torchdefer.materialize import _parallel as parallel

    rows = []
    for n in sizes:
        times = {}
        for threads in (1, 2):
            runs = []
            for i in range(repeat + 1):
                torch.manual_seed(i)
                t = torchdefer.deferred_init(lambda n=n: torch.empty(n).normal_())
                with parallel.min_chunk(16):
                    runs.append(_timed(lambda t=t, k=threads: torchdefer.materialize_tensor(
                        t, threads=k)))
            times[threads] = statistics.median(runs[1:])
        rows.append(dict(n=n, one=times[1], two=times[2]))
    return rows


# ---------------------------------------------------------------- report


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}"


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _report(args, runs, rates, jumps, threshold, load_before, load_after) -> str:
    cases = list(dict.fromkeys(r["case"] for r in runs))
    med = {c: statistics.median(r["seconds"] for r in runs if r["case"] == c) for c in cases}
    cpu = {c: statistics.median(r["cpu"] for r in runs if r["case"] == c) for c in cases}
    peak = {c: max(r["peak"] for r in runs if r["case"] == c) for c in cases}
    prints = {c: {r["fingerprint"] for r in runs if r["case"] == c} for c in cases}
    reference = prints.get("eager") or prints.get("threads=1")
    params = runs[0]["params"]
    lines = [
        "# Parallel CPU materialization",
        "",
        f"`{' '.join(['nice python bench/bench_parallel.py', *sys.argv[1:]])}`",
        "",
        f"Machine: {_machine()}. Model: `{args.model}` ({params:,} parameters, fp32), "
        f"seed 0; medians of {args.repeat} run(s) per case, cases in turns, each in its "
        "own process.",
        "",
        f"Load before: `{load_before}`",
        f"Load after: `{load_after}`",
        "",
        "Ratios are per round (each case against threads=1, or eager, of the same round): "
        "median [min, max]. Load: the 1-minute load average at the end of each run.",
        "",
        "| case | median s | vs threads=1 | vs eager | CPU s | peak MiB | peak vs threads=1 "
        "| bits equal eager | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios, to_eager = _round_ratios(runs, cases, "threads=1"), _round_ratios(runs, cases, "eager")
    for c in cases:
        vs_one, vs_eager = ratios.get(c, ""), to_eager.get(c, "")
        vs_peak = f"{peak[c] / peak['threads=1']:.3f}" if "threads=1" in peak else ""
        equal = "yes" if prints[c] == reference and len(prints[c]) == 1 else "NO"
        lines.append(f"| {c} | {med[c]:.2f} | {vs_one} | {vs_eager} | {cpu[c]:.2f} "
                     f"| {peak[c] / MiB:,.0f} "
                     f"| {vs_peak} | {equal} | {_loads(runs, c)} |")
    for c in cases:
        if f"{c} serial" in cases:  # the gain of replaying independent tensors side by side
            side = _round_ratios(runs, [c], f"{c} serial").get(c, "")
            lines += ["", f"`{c}` against `{c} serial` (one tensor in flight), per round: "
                      f"**{side}**"]
    lines += _model_lines(rates, jumps, params)
    lines += ["", "## Chunk threshold", "",
              "One `normal_` of n float32 elements, `materialize_tensor` with 1 and 2 threads "
              "(chunks allowed at any size; medians). `rng._chunks.MIN_CHUNK` is "
              f"{_min_chunk():,} elements.", "",
              "| n | 1 thread ms | 2 threads ms | ratio |", "|---|---|---|---|"]
    for row in threshold:
        lines.append(f"| {row['n']:,} | {row['one'] * 1e3:.1f} | {row['two'] * 1e3:.1f} "
                     f"| {row['two'] / row['one']:.2f} |")
    return "\n".join(lines) + "\n"


def _round_ratios(runs: list[dict], cases: list[str], base: str) -> dict[str, str]:
    """``case -> "median [min, max]"`` of its time over ``base``'s in the same round."""
    rounds: dict[int, dict[str, float]] = {}
    for r in runs:
        rounds.setdefault(r["round"], {})[r["case"]] = r["seconds"]
    out = {}
    for c in cases:
        xs = [t[c] / t[base] for t in rounds.values() if c in t and base in t]
        if xs and c not in (base, "eager"):
            out[c] = f"{statistics.median(xs):.2f}x [{min(xs):.2f}, {max(xs):.2f}]"
    return out


def _loads(runs: list[dict], case: str) -> str:
    return ", ".join(f"{r['load']:.1f}" for r in runs if r["case"] == case)


def _lead() -> int:
    from torchdefer.rng import _chunks as chunks

    return chunks.LEAD


def _min_chunk() -> int:
    from torchdefer.rng import _chunks as chunks

    return chunks.MIN_CHUNK


def _model_lines(rates: dict, jumps: dict, params: int) -> list[str]:
    mt = rates["mt_words_per_s"]
    normal = rates["normal_bytes_per_s"]
    fill1, fill_all = rates["fill_bytes_per_s_1core"], rates["fill_bytes_per_s_all"]
    # normal_ writes each element twice and reads it once (uniforms, then the
    # Box-Muller pass over them): 12 bytes of traffic per 4-byte element.
    traffic = 3 * normal
    floor = _min_chunk()
    return [
        "", "## Measured here, one core", "",
        f"- mt19937: {mt / 1e6:,.0f} M words/s ({4 * mt / 1e9:.2f} GB/s of words)",
        f"- `normal_` float32: {normal / 1e9:.2f} GB/s written "
        f"({traffic / 1e9:.2f} GB/s of memory traffic: uniforms written, read, normals written)",
        f"- `uniform_` float32: {rates['uniform_bytes_per_s'] / 1e9:.2f} GB/s written",
        f"- `fill_`: {fill1 / 1e9:.2f} GB/s on one core, {fill_all / 1e9:.2f} GB/s on all "
        f"{os.cpu_count()} cores (the write bandwidth here)",
        f"- a jump: {jumps['jump_new_s'] * 1e3:.1f} ms with a new power of x, "
        f"{jumps['jump_known_s'] * 1e3:.1f} ms with a known one",
        "",
        "## How it extends to 64 cores (on paper)",
        "",
        "A chunk costs one jump and its share of the fill; chunks run independently, so "
        "the time on `c` cores is `max(fill work / c, memory traffic / bandwidth)` plus "
        "one jump per chunk (jumps of one tensor run in parallel, and tensors of one shape "
        "share their powers of x). Per float32 element the fill does "
        f"{4 / normal * 1e9:.2f} ns of work on one core here and moves 12 bytes.",
        "",
        f"- Generator-bound: {params:,} elements at {4 / normal * 1e9:.2f} ns take "
        f"{params * 4 / normal:.1f} s on one core, {params * 4 / normal / 64:.2f} s on 64.",
        f"- Bandwidth-bound: 64 cores ask {64 * traffic / 1e9:.0f} GB/s; a 64-core server "
        "socket gives ~200-400 GB/s (8-12 DDR5 channels), so the fill stays "
        f"generator-bound up to ~{300e9 / traffic:.0f} cores at 300 GB/s and the model's "
        f"{params * 12 / 1e9:.1f} GB of traffic takes >= {params * 12 / 300e9:.2f} s.",
        f"- Jumps: at most 64 per tensor, in parallel ({jumps['jump_known_s'] * 1e3:.0f}-"
        f"{jumps['jump_new_s'] * 1e3:.0f} ms each), while the first chunk, which needs none, "
        f"draws `chunks.LEAD` = {_lead():,} elements more; with `MIN_CHUNK` = {floor:,} elements "
        f"a tensor splits 64 ways from {64 * floor / 1e6:.0f}M elements on. Smaller "
        f"tensors use fewer chunks: a Llama 1B's 4.2M and 16.8M ones get "
        f"{(1 << 22) // floor} and {(1 << 24) // floor}; tensors below the split size "
        "replay side by side, in runs of consecutive tensors (one jump per run), so at 64 "
        "cores the serial part, the replay's Python per tensor (it holds the GIL: ~0.1 s "
        "over a Llama 1B's 148 tensors), bounds the speed-up before bandwidth does.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--threads", default="1,2,3,4",
                        help="thread counts; T-serial: T threads, one tensor in flight at a "
                             "time (independent tensors not side by side)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-eager", action="store_true")
    parser.add_argument("--sizes", default="262144,524288,1048576,2097152,4194304,16777216")
    parser.add_argument("--rate-elements", type=int, default=1 << 25,
                        help="elements of the one-core rate measurements")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true",
                        help="threads 1 and 2 only, two threshold sizes (~2-3 min)")
    args = parser.parse_args()
    if args.quick:
        args.threads, args.sizes = "1,2", "1048576,16777216"
    cases = ([] if args.no_eager else ["eager"]) + [
        f"threads={t.replace('-', ' ')}" for t in args.threads.split(",")]
    load_before = _uptime()
    runs = [{**_spawn(case, args.model), "round": i} for i in range(args.repeat)
            for case in cases]
    elements = args.rate_elements
    rates = _one_core_rates(elements)
    rates["fill_bytes_per_s_all"] = _all_core_fill(elements)
    jumps = _jump_costs()
    threshold = _threshold([int(s) for s in args.sizes.split(",")], repeat=max(args.repeat, 3))
    text = _report(args, runs, rates, jumps, threshold, load_before, _uptime())
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
