"""The report of ``bench/bench_sharded.py``: tables, ratios, and the 70B extrapolation.

    python -m bench.sharded_report bench/results/sharded.json   # rewrites sharded.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MiB = 1 << 20


def _per_world(rows: list[dict], path: str, key: str = "cpu") -> dict[int, float]:
    """The slowest rank's materialization time (median CPU or wall) per world size."""
    out: dict[int, float] = {}
    for row in rows:
        if row["path"] == path:
            out[row["world"]] = max(out.get(row["world"], 0.0), row[key])
    return out


def fit(times: dict[int, float]) -> tuple[float, float]:
    """Least squares ``t(W) = A + B / W``: A per rank whatever W, B shared by the ranks."""
    xs = [1 / w for w in times]
    ys = list(times.values())
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, my
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def report(r: dict) -> str:
    shape, scale = r["shape"], r["scale"]
    model = scale["model"]
    lines = [
        "# Sharded materialization: each rank pays for its shard",
        "",
        f"Llama-shaped model (transformers `LlamaForCausalLM`, {shape['num_hidden_layers']} "
        f"layers, hidden {shape['hidden_size']}, intermediate {shape['intermediate_size']}, "
        f"vocabulary {shape['vocab_size']}): {model['elements'] / 1e9:.2f}B fp32 parameters "
        f"in {model['params']} tensors. {r['machine']}; load average "
        f"{r['load'][0][0]:.1f} at start, {r['load'][1][0]:.1f} at the end (other tenants share "
        "this machine). One thread per process; the ranks of a world materialize one after "
        "the other (the others wait in a barrier, asleep), so each rank's time and peak memory "
        f"are its own. Each rank materializes a fresh model {r['repeats']} times; times are "
        "medians. Ratios use CPU time, what a rank pays; wall time on this shared 2-vCPU "
        "machine also counts other tenants' load.",
        "",
        f"Command: `{r['command']}` (method: the module docstring of `bench/bench_sharded.py`).",
        "",
        "## FSDP2 (`fully_shard` per decoder layer and the root)",
        "",
        "`rows`: this branch (each shard from its own elements); `full`: "
        "`TORCHDEFER_SHARD_ROWS=0`, every shard through its full parameter (the path before). "
        "`peak`: RSS high-water mark over the RSS before materializing. `bitwise`: every "
        "local shard equals the slice of the eagerly built parameter.",
        "",
        "| path | world | rank | CPU (s) | wall (s) | peak (MiB) | local shards (MiB) "
        "| largest parameter (MiB) | params from rows | bitwise |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in sorted(r["fsdp"], key=lambda x: (x["path"] != "rows", x["world"], x["rank"])):
        lines.append(
            f"| {row['path']} | {row['world']} | {row['rank']} | {row['cpu']:.2f} | "
            f"{row['wall']:.2f} | {row['peak'] / MiB:.0f} | {row['shards'] / MiB:.0f} | "
            f"{row['largest'] / MiB:.0f} | {row['rows']}/{row['params']} | "
            f"{'yes' if row['bitwise'] else '**NO**'} |"
        )
    rows, full = _per_world(r["fsdp"], "rows"), _per_world(r["fsdp"], "full")
    walls = _per_world(r["fsdp"], "rows", "wall")
    firsts = _per_world(r["fsdp"], "rows", "first")
    one, one_wall, one_first = rows.get(1), walls.get(1), firsts.get(1)
    lines += [
        "", "Per-rank time of the slowest rank against one rank, in this run. *First run*: "
        "the first of the repeats, with cold caches (each new jump distance computes its "
        "polynomial once per process; later runs, like later layers of a deep model, reuse "
        "them).", "",
        "| world | rows, CPU (s) | / 1 rank | wall (s) | / 1 rank | first run, CPU (s) "
        "| / 1 rank | ideal | full path, CPU (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for world, seconds in sorted(rows.items()):
        ratio = f"**{seconds / one:.2f}**" if one else "-"
        wall, first = walls[world], firsts[world]
        wall_ratio = f"{wall / one_wall:.2f}" if one_wall else "-"
        first_ratio = f"{first / one_first:.2f}" if one_first else "-"
        before = f"{full[world]:.2f}" if world in full else "-"
        lines.append(f"| {world} | {seconds:.2f} | {ratio} | {wall:.2f} | {wall_ratio} | "
                     f"{first:.2f} | {first_ratio} | {1 / world:.2f} | {before} |")
    lines += _pipeline(r)
    lines += _extrapolation(r, rows, full)
    return "\n".join(lines) + "\n"


def _pipeline(r: dict) -> list[str]:
    whole, stage = r["pipeline"]["whole"], r["pipeline"]["stage"]
    share = stage["params"] / whole["params"]
    return [
        "",
        f"## Pipeline stages ({r['stages']} stages, split as torchtitan splits)",
        "",
        "`whole`: `materialize_module(model)`; `last stage`: what torchtitan's "
        "`pipeline_module_split` builds for the last of the stages "
        "`generate_llm_fqn_per_model_part` assigns with its default weights (the embedding "
        "and the norm + head count as one layer each): a `copy.deepcopy` of the deferred "
        "model with the other layers dropped and the embedding set to None, then "
        "`materialize_module(stage)`.",
        "",
        "| what | parameters | CPU (s) | wall (s) | peak (MiB) | bitwise |",
        "|---|---|---|---|---|---|",
        f"| whole model | {whole['params'] / 1e6:.0f}M | {whole['cpu']:.2f} | "
        f"{whole['wall']:.2f} | {whole['peak'] / MiB:.0f} | "
        f"{'yes' if whole['bitwise'] else '**NO**'} |",
        f"| last stage | {stage['params'] / 1e6:.0f}M ({share:.2f} of the model) | "
        f"{stage['cpu']:.2f} | {stage['wall']:.2f} | {stage['peak'] / MiB:.0f} | "
        f"{'yes' if stage['bitwise'] else '**NO**'} |",
        "",
        f"Last stage / whole model: **{stage['cpu'] / whole['cpu']:.2f}** of the CPU time "
        f"({stage['wall'] / whole['wall']:.2f} of the wall time) for {share:.2f} of the "
        f"parameters (eager construction of the whole model: {r['eager_seconds']:.2f} s).",
    ]


def _extrapolation(r: dict, rows: dict[int, float], full: dict[int, float]) -> list[str]:
    scale = r["scale"]
    model, big = scale["model"], scale["70b"]
    fits = {"warm caches (medians)": fit(rows), "cold (first runs)": fit(
        _per_world(r["fsdp"], "rows", "first"))}
    a, b = fits["warm caches (medians)"]
    jumps = r["jumps"]
    fallbacks = max((row["params"] - row["rows"] for row in r["fsdp"] if row["path"] == "rows"),
                    default=0)
    lines = [
        "",
        "## Extrapolation to Llama 3.1 70B",
        "",
        "Method. On the row path a rank's time is a part every rank pays whatever the world "
        "size (per parameter: a jump-ahead of the generator to the shard's first word, the "
        "plan, Python) plus the draws and elementwise work of its shard, which the ranks "
        f"share. Fitting `t(W) = A + B / W` to the slowest rank's CPU time at W = "
        f"{', '.join(str(w) for w in sorted(rows))} gives A = {a:.2f} s for "
        f"{model['params']} tensors and B = {b:.2f} s for {model['elements'] / 1e9:.2f}B "
        f"elements. Llama 3.1 70B (hidden 8192, 80 layers, vocabulary 128256; counted on the "
        f"meta device) has {big['params']} tensors and {big['elements'] / 1e9:.1f}B elements, "
        f"so A scales by {big['params'] / model['params']:.1f} and B by "
        f"{big['elements'] / model['elements']:.1f}. A jump costs about the same at 70B's "
        "distances: the power of the jump polynomial is cached per distance, and the "
        "distances repeat from one identical layer to the next, so 70B's 80 layers pay "
        "the cold cost for a few parameters only (measured, one jump of 2^24, 2^28 and 2^32 "
        "words, cold then warm: "
        + ", ".join(f"{v['cold'] * 1e3:.0f}/{v['warm'] * 1e3:.0f} ms" for v in jumps.values())
        + "). The second column fits the first runs instead (each distance's polynomial "
        "computed once in the process, as in a real run of this 8-layer model). The full "
        "path does the whole model on every rank: its time scales by the elements alone.",
        "",
        "| world | rows path, per rank (warm caches) | rows path, per rank (cold) "
        "| full path, per rank |",
        "|---|---|---|---|",
    ]
    one_full = full.get(1)
    for world in (8, 64):
        cells = []
        for a_, b_ in fits.values():
            per_rank = b_ * big["elements"] / model["elements"] / world
            t = a_ * big["params"] / model["params"] + per_rank
            cells.append(f"{t / 60:.1f} min ({t:.0f} s)")
        before = (
            f"{one_full * big['elements'] / model['elements'] / 60:.1f} min"
            if one_full else "-"
        )
        lines.append(f"| {world} | {cells[0]} | {cells[1]} | {before} |")
    shard_gib = big["elements"] * 4 / 64 / (1 << 30)
    lines += [
        "",
        f"Per-rank memory on the row path is the rank's shards ({shard_gib:.1f} GiB of fp32 "
        "for 70B on 64 ranks) plus the jump's scratch (the peaks above: a few tens of MiB "
        "over the shards); a parameter that falls back adds one full parameter while it "
        f"is made ({fallbacks} fell back in this model).",
    ]
    return lines


if __name__ == "__main__":
    source = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/sharded.json")
    source.with_suffix(".md").write_text(report(json.loads(source.read_text())))
