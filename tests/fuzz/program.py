"""Fuzz programs: what one is, how one is generated, how one prints.

A :class:`Program` is one to three *segments* of Python lines; each segment
runs in its own ``deferred_init`` call (or plainly, in the eager world), with
an optional eager draw between segments. Generation runs every proposed line
eagerly from the program's seed and keeps the lines that ran, so a program is
valid eager code by construction (the harness still skips one that raises).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ambient_families import MATERIALIZE_UNDER, reset_ambient, stop_worker
from context import Ctx
from custom_ops import noise_tagged, noise_untagged
from families import FAMILIES

__all__ = ["FOCUS", "Program", "fresh_namespace", "generate", "render"]

_BASE = {"factory": 4, "view": 3, "inplace": 3, "compute": 2, "data": 1, "param": 1}

# What each fuzz test mixes: the family it is about, over the ordinary ops.
# ``segments``: how many deferred_init calls in a row; ``mutate_external``:
# change the outside tensors between recording and materialization.
FOCUS: dict[str, dict] = {
    "core": {"families": _BASE},
    "modules": {"families": {**_BASE, "module": 6}},
    "layouts_and_writes": {"families": {**_BASE, "exotic": 6}},
    "multi_output_views": {"families": {**_BASE, "multi_view": 4, "multi_view_init": 3}},
    "set_": {"families": {**_BASE, "set_": 4}},
    "storage_growth": {"families": {**_BASE, "grow": 4, "set_": 1}},
    "dead_writes": {"families": {**_BASE, "cover": 5, "random": 1}},
    "relaid_storages": {"families": {**_BASE, "relaid": 4, "set_": 1}},
    "default_dtype": {"families": {**_BASE, "default_dtype": 3, "promote": 5, "int_factory": 2}},
    "random_ops": {"families": {**_BASE, "random": 6, "random_on": 4}},
    "random_custom_ops": {"families": {**_BASE, "custom_random": 3}},
    "rng_state": {"families": {**_BASE, "random": 5, "random_on": 2, "rng_state": 4}},
    "data_reads": {"families": {**_BASE, "data_read": 4, "int_factory": 1}},
    "questions": {"families": {**_BASE, "question": 4}},
    "batch_norm": {"families": {**_BASE, "batch_norm": 5}},
    "external": {"families": {**_BASE, "external": 4}, "mutate_external": True},
    "consecutive_deferred_init": {"families": {**_BASE, "random": 5, "random_on": 2},
                                  "segments": (2, 3)},
    "ambient": {"families": {**_BASE, "ambient": 5, "random": 2, "module": 1},
                "materialize_under": True},
    "eager_refusals": {"families": {**_BASE, "refused": 4, "int_factory": 1, "ambient": 1}},
    "threads": {"families": {**_BASE, "thread": 3, "random": 3, "random_on": 2, "module": 1},
                "segments": (1, 2)},
    # Not `grow`: mixed with the other families, its resize_/set_ lines make eager
    # PyTorch abort the process (a c10 assert in Dispatcher.cpp at teardown:
    # tests/fuzz/long_run_results.md); storage_growth has it alone.
    "everything": {"families": {name: 2 for name in FAMILIES if name != "grow"} | {"factory": 4},
                   "segments": (1, 3), "mutate_external": True},
}

# What the harness changes between recording and materialization, and how it
# reads: the eager world makes the same change at the same point.
EXTERNAL_MUTATIONS = ("ext.data.add_(1)", "arr += 1", "ext.add_(1)")


@dataclass(frozen=True, slots=True)
class Program:
    seed: int
    segments: tuple[tuple[str, ...], ...]
    eager_draw_between: tuple[bool, ...] = ()  # before segment i + 1
    mutation: str | None = None  # one of EXTERNAL_MUTATIONS, run after the last segment
    materialize_under: str = ""  # one of MATERIALIZE_UNDER: the setting materialization runs in

    @property
    def lines(self) -> list[str]:
        return [line for segment in self.segments for line in segment]

    def without(self, segment: int, line: int) -> Program:
        segments = list(self.segments)
        segments[segment] = segments[segment][:line] + segments[segment][line + 1:]
        return replace(self, segments=tuple(segments))


def fresh_namespace(generators: tuple[torch.Generator, ...], ext: torch.Tensor,
                    arr: np.ndarray) -> dict:
    g0, g1 = generators
    return {"torch": torch, "nn": nn, "F": F, "copy": copy, "g0": g0, "g1": g1, "ext": ext,
            "arr": arr, "noise_tagged": noise_tagged, "noise_untagged": noise_untagged}


def make_generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    return torch.Generator().manual_seed(seed + 1), torch.Generator().manual_seed(seed + 2)


def make_externals() -> tuple[torch.Tensor, np.ndarray]:
    return torch.arange(6.0), np.arange(4, dtype=np.float32)


def generate(seed: int, focus: str, max_lines: int = 24) -> Program:
    """A program for ``focus`` from ``seed``: lines that ran eagerly from that seed."""
    spec = FOCUS[focus]
    rng = random.Random(f"{focus}/{seed}")
    low, high = spec.get("segments", (1, 1))
    n_segments = rng.randint(low, high)
    families, weights = zip(*spec["families"].items())
    torch.manual_seed(seed)
    generators = make_generators(seed)
    ext, arr = make_externals()
    segments, between = [], []
    dtype = torch.get_default_dtype()
    try:
        for k in range(n_segments):
            if k:
                between.append(rng.random() < 0.5)
                if between[-1]:
                    torch.randn(3)
            env = fresh_namespace(generators, ext, arr)
            ctx = Ctx(rng, env)
            lines: list[str] = []
            target = rng.randint(6, max_lines // n_segments + 4)
            for _ in range(3 * target):
                if len(lines) == target:
                    break
                line = FAMILIES[rng.choices(families, weights)[0]](ctx)
                if line is not None and _runs(line, env):
                    lines.append(line)
            segments.append(tuple(lines))
            torch.set_default_dtype(dtype)  # as the harness does after each segment
            reset_ambient()
    finally:
        torch.set_default_dtype(dtype)
        reset_ambient()
        stop_worker()
    mutation = rng.choice(EXTERNAL_MUTATIONS) if spec.get("mutate_external") else None
    under = rng.choice(MATERIALIZE_UNDER) if spec.get("materialize_under") else ""
    return Program(seed, tuple(segments), tuple(between), mutation, under)


def _runs(line: str, env: dict) -> bool:
    try:
        exec(compile(line, "<fuzz program>", "exec"), env)
    except Exception:
        return False
    return True


def render(program: Program, order: str, sequence: list[str], detail: str) -> str:
    """A standalone script that shows the failure with plain torchdefer calls."""
    out = [f"# fuzz failure, materialization order {order!r}:",
           *(f"#   {line}" for line in detail.splitlines()[:6]),
           "import contextlib, copy, functools", "import numpy as np, torch, torchdefer",
           "import torch.nn.functional as F", "from torch import nn"]
    if "noise_" in "\n".join(program.lines):
        out.append("from custom_ops import noise_tagged, noise_untagged  # tests/fuzz on sys.path")
    if program.materialize_under.startswith("settings"):
        out.append("from ambient_families import settings  # tests/fuzz on sys.path")
    out.append("")
    for k, segment in enumerate(program.segments):
        out.append(f"def segment{k}(g0, g1, ext, arr):")
        out += [f"    {line}" for line in segment] or ["    pass"]
        out += ["    return locals()", ""]
    out += ["def build(defer):",
            f"    torch.manual_seed({program.seed})",
            f"    g0 = torch.Generator().manual_seed({program.seed + 1})",
            f"    g1 = torch.Generator().manual_seed({program.seed + 2})",
            "    ext, arr = torch.arange(6.0), np.arange(4, dtype=np.float32)",
            "    run = torchdefer.deferred_init if defer else (lambda f, *a: f(*a))",
            "    results = []"]
    for k in range(len(program.segments)):
        if k and program.eager_draw_between[k - 1]:
            out.append("    torch.randn(3)  # an eager draw between two segments")
        out += [f"    results.append(run(segment{k}, g0, g1, ext, arr))",
                "    torch.set_default_dtype(torch.float32)  # as deferred_init leaves it",
                "    torch.use_deterministic_algorithms(False)",
                "    __import__('torchdefer._compat', fromlist=['_']).restore_default_device(None)"]
    if "ambient_families" in "\n".join(program.lines):
        out.append("    __import__('ambient_families').stop_worker()  # tests/fuzz on sys.path")
    if program.mutation:
        out.append(f"    {program.mutation}  # after recording, before materializing")
    out += ["    draws = (torch.randn(5), torch.randn(5, generator=g0), torch.randn(5, generator=g1))",
            "    return results, draws", "",
            "(eager, eager_draws), (lazy, lazy_draws) = build(False), build(True)",
            "print('generators end where eager leaves them:',",
            "      [torch.equal(a, b) for a, b in zip(lazy_draws, eager_draws)])",
            "",
            "def lookup(results, key):",
            "    segment, name = key.split(':')",
            "    head, *rest = name.split('.')",
            "    step = lambda obj, a: obj[int(a)] if a.isdigit() else getattr(obj, a)",
            "    return functools.reduce(step, rest, results[int(segment)][head])",
            "",
            f"for key in {sequence!r}:  # the order that failed",
            "    if key.startswith('module '):",
            f"        with {program.materialize_under or 'contextlib.nullcontext()'}:",
            "            torchdefer.materialize_module(lookup(lazy, key[7:]))",
            "        continue",
            f"    with {program.materialize_under or 'contextlib.nullcontext()'}:",
            "        got = torchdefer.materialize_tensor(lookup(lazy, key))",
            "    want = lookup(eager, key)",
            "    same = (got.dtype == want.dtype and got.shape == want.shape",
            "            and got.stride() == want.stride() and torch.equal(got, want))",
            "    print(key, 'same' if same else f'DIFFERS\\n  deferred {got!r}\\n  eager    {want!r}')",
            "for k, ns in enumerate(eager):  # values read while building",
            "    for name, want in ns.items():",
            "        if name[0] == 'v' and repr(lazy[k][name]) != repr(want):",
            "            print(f'{k}:{name} DIFFERS: deferred {lazy[k][name]!r}, eager {want!r}')"]
    return "\n".join(out)
