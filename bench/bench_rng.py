"""RNG stream accounting: a tensor costs its own draws; jumps; recording overhead.

Each case runs in a fresh process (``--case NAME`` prints one JSON line); the
default run does them all and writes ``bench/results/rng.md`` and
``rng.json``. Ratios are taken within one run (shared machines are noisy).

* ``eager``, ``whole``: a 1.1B Llama-shaped model (TinyLlama: hidden 2048,
  22 layers, vocabulary 32000) built eagerly, and deferred then materialized
  whole on the CPU; bitwise fingerprints compared.
* ``last_layer``, ``lm_head``: a fresh deferred model, then only
  ``model.layers[21]`` or only ``lm_head`` materialized. Their *share* is the
  whole model's time times their part of its parameters.
* ``jumps``: jumps of the CPU generator by random distances up to 2**37
  words: the process's first (it builds the table of powers), new distances
  once the table is warm, and the same distances again.
* ``defer70b``, ``meta70b``: building the 70B Llama shape under
  ``deferred_init`` and under the meta device (after a warm-up build).

    python bench/bench_rng.py [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

CASES = ("eager", "whole", "last_layer", "lm_head", "jumps", "meta70b", "defer70b")
TINYLLAMA = dict(
    hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
    num_key_value_heads=4, vocab_size=32000,
)  # fmt: skip
LLAMA70B = dict(
    hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
    num_key_value_heads=8, vocab_size=128256,
)  # fmt: skip


def _model(shape: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM, LlamaConfig(**shape)


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def run_case(name: str) -> dict:
    import torch

    import torchdefer
    from bench.fingerprint import fingerprint

    torch.set_num_threads(1)
    cls, cfg = _model(TINYLLAMA)
    if name == "eager":
        torch.manual_seed(0)
        start = time.perf_counter()
        model = cls(cfg)
        return {"seconds": time.perf_counter() - start, "fingerprint": fingerprint(model)}
    if name in ("whole", "last_layer", "lm_head"):
        torch.manual_seed(0)
        model = torchdefer.deferred_init(cls, cfg)
        part = {"whole": model, "last_layer": model.model.layers[-1], "lm_head": model.lm_head}
        target = part[name]
        start = time.perf_counter()
        torchdefer.materialize_module(target)
        seconds = time.perf_counter() - start
        out = {"seconds": seconds, "params": _params(target), "total": _params(model)}
        if name == "whole":
            out["fingerprint"] = fingerprint(model)
        return out
    if name == "jumps":
        return _jumps()
    shape_cls, shape_cfg = _model(LLAMA70B)
    small_cls, small_cfg = _model({**LLAMA70B, "hidden_size": 64, "intermediate_size": 128,
                                   "num_attention_heads": 4, "num_key_value_heads": 2,
                                   "num_hidden_layers": 2, "vocab_size": 256})
    if name == "meta70b":
        with torch.device("meta"):
            small_cls(small_cfg)
        start = time.perf_counter()
        with torch.device("meta"):
            shape_cls(shape_cfg)
        return {"seconds": time.perf_counter() - start}
    if name == "defer70b":
        torchdefer.deferred_init(small_cls, small_cfg)
        start = time.perf_counter()
        torchdefer.deferred_init(shape_cls, shape_cfg)
        return {"seconds": time.perf_counter() - start}
    raise SystemExit(f"unknown case {name!r}; cases: {', '.join(CASES)}")


def _jumps() -> dict:
    """The process's first jump (builds the tables), then new distances, then repeats."""
    import torch

    from torchdefer.rng import mt19937

    state = torch.Generator().manual_seed(1).get_state()
    rng = random.Random(0)
    distances = [rng.randrange(1 << 23, 1 << 37) for _ in range(17)]

    def timed(words: int) -> float:
        start = time.perf_counter()
        mt19937.advance(state, words)
        return time.perf_counter() - start

    first = timed(distances[0])
    for words in distances[1:9]:  # warm the table of powers with other distances
        timed(words)
    new = [timed(words) for words in distances[9:]]
    again = [timed(words) for words in distances[9:]]
    return {"first": first, "new": new, "again": again}


def _subprocess(name: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run(
        [sys.executable, __file__, "--case", name], capture_output=True, text=True, env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=CASES)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case)))
        return
    load_start = os.getloadavg()
    results = {name: _subprocess(name) for name in CASES}
    results["load"] = [load_start, os.getloadavg()]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rng.json").write_text(json.dumps(results, indent=1))
    (args.out / "rng.md").write_text(report(results))
    print(report(results))


def report(r: dict) -> str:
    whole, eager = r["whole"]["seconds"], r["eager"]["seconds"]
    total = r["whole"]["total"]
    rows = []
    for name in ("last_layer", "lm_head"):
        share = whole * r[name]["params"] / total
        rows.append((name, r[name]["seconds"], share, r[name]["seconds"] / share))
    jumps = r["jumps"]
    first, new, again = jumps["first"], max(jumps["new"]), max(jumps["again"])
    defer, meta = r["defer70b"]["seconds"], r["meta70b"]["seconds"]
    same = r["whole"]["fingerprint"] == r["eager"]["fingerprint"]
    lines = [
        "# RNG stream accounting",
        "",
        f"Command: `python bench/bench_rng.py` ({platform.node()}, {os.cpu_count()} cores, "
        f"load {r['load'][0][0]:.1f} at start, {r['load'][1][0]:.1f} at end; one thread per "
        "case, each in its own process).",
        "",
        "| measure | value | target |",
        "| --- | --- | --- |",
        f"| whole 1.1B model, materialize / eager | {whole:.2f} s / {eager:.2f} s = "
        f"{whole / eager:.2f}x (bitwise equal: {same}) | <= 1.0x |",
    ]
    for name, seconds, share, ratio in rows:
        lines.append(f"| only `{name}` / its share | {seconds:.2f} s / {share:.2f} s = "
                     f"{ratio:.2f}x | <= 2x |")
    lines += [
        f"| one jump to a new distance (worst of 8, up to 2**37 words) | {new * 1e3:.0f} ms "
        "| <= 50 ms |",
        f"| the same jumps again (cached powers) | {again * 1e3:.0f} ms | |",
        f"| a process's first jump (builds its tables of powers) | {first * 1e3:.0f} ms | |",
        f"| `deferred_init` 70B / meta device | {defer:.3f} s / {meta:.3f} s = "
        f"{defer / meta:.1f}x | <= 10x |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
