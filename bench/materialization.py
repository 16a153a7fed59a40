"""Suite 2: materializing a deferred model on CPU, against building it eagerly.

Each way in a fresh child, against eager construction of the same model.
``eager`` and ``materialize_module`` run alternately (eager, materialize,
eager, materialize) and the medians are compared, so that a change in the
machine's load during the run moves both sides alike.

``eager``
    ``torch.manual_seed(0); model = LlamaForCausalLM(config)``: the reference.
``materialize_module``
    ``deferred_init`` then one ``materialize_module(model)``. Time and peak RSS
    are compared with eager construction; the peak counts the graph too (the
    window starts before ``deferred_init``).
``reverse tensors``
    ``materialize_tensor`` on each tensor of the state dict, last first. Random
    ops before a tensor are drawn into scratch memory to reach its RNG state,
    so this order does the most extra work.
``per submodule``
    ``materialize_module`` on each unit in forward order: the embedding, each
    decoder layer, the final norm, the head (for the 1T stack: each block).

For the stepwise ways every step's exact peak is read (``memory.py``), and
its *excess* is that peak minus (RSS after ``deferred_init`` + bytes
materialized so far, this step included): what is in memory beyond the ideal.
Every way ends with a fingerprint of the weights, compared with eager's.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import torch
from torch import nn

from bench.fingerprint import fingerprint
from bench.models import build_fn, spec_named

__all__ = ["MODES", "run_case", "units"]

MODES = ("eager", "materialize_module", "reverse tensors", "per submodule")


def run_case(case: dict[str, Any], probe) -> dict[str, Any]:
    """Child side: materialize ``case["model"]`` the way ``case["mode"]`` says."""
    import torchdefer

    spec = spec_named(case["model"])
    fn, args = build_fn(spec)
    mode = case["mode"]
    if mode == "eager":
        return _eager(fn, args, probe)
    _warm_up(torchdefer)
    probe.begin()
    torch.manual_seed(0)
    with probe.measure("deferred_init") as phase:
        model = torchdefer.deferred_init(fn, *args)
    result: dict[str, Any] = {"init_seconds": phase["seconds"]}
    gc.collect()
    if mode == "materialize_module":
        with probe.measure("materialize") as phase:
            torchdefer.materialize_module(model)
        result["seconds"] = phase["seconds"]
        state: Any = model
    elif mode == "reverse tensors":
        state = _reverse_tensors(model, probe, result)
    elif mode == "per submodule":
        _per_submodule(model, probe, result)
        state = model
    else:
        raise ValueError(f"unknown materialization mode {mode!r}; known: {MODES}")
    probe.stop()
    result["fingerprint"] = fingerprint(state)
    return result


def _eager(fn, args, probe) -> dict[str, Any]:
    tiny_fn, tiny_args = build_fn(spec_named("llama-tiny"))
    tiny_fn(*tiny_args)  # the same warm-up as the construction suite's eager case
    gc.collect()
    probe.begin()
    torch.manual_seed(0)
    with probe.measure("eager") as phase:
        model = fn(*args)
    probe.stop()
    return {"seconds": phase["seconds"], "init_seconds": None,
            "fingerprint": fingerprint(model)}


def _warm_up(torchdefer) -> None:
    fn, args = build_fn(spec_named("llama-tiny"))
    torchdefer.materialize_module(torchdefer.deferred_init(fn, *args))
    gc.collect()


def _reverse_tensors(model: nn.Module, probe, result: dict[str, Any]) -> dict[str, torch.Tensor]:
    import torchdefer

    state = model.state_dict(keep_vars=True)
    steps = [(name, [t]) for name, t in reversed(state.items())]
    reals: dict[str, torch.Tensor] = {}

    def step(name: str, tensors: list[torch.Tensor]) -> None:
        reals[name] = torchdefer.materialize_tensor(tensors[0])

    _stepwise(steps, step, probe, result, "tensors")
    return dict(sorted(reals.items()))


def _per_submodule(model: nn.Module, probe, result: dict[str, Any]) -> None:
    import torchdefer

    steps = [(name, [*unit.parameters(), *unit.buffers()]) for name, unit in units(model)]
    modules = dict(units(model))

    def step(name: str, tensors: list[torch.Tensor]) -> None:
        torchdefer.materialize_module(modules[name])

    _stepwise(steps, step, probe, result, "submodules")


def _stepwise(steps, run_step, probe, result: dict[str, Any], what: str) -> None:
    """Run the steps one by one, reading each one's exact peak; fill ``result``."""
    base = probe.meter.reset()
    counted: set[int] = set()
    done_bytes = 0
    records = []
    last_note = time.perf_counter()
    for i, (name, tensors) in enumerate(steps):
        step_bytes = 0
        for t in tensors:
            if _is_deferred(t) and id(t) not in counted:
                counted.add(id(t))
                step_bytes += t.numel() * t.element_size()
        with probe.measure(f"step {i}", collect=False) as phase:
            run_step(name, tensors)
        done_bytes += step_bytes
        records.append({"name": name, "bytes": step_bytes, "done": done_bytes,
                        "seconds": phase["seconds"], "peak": phase["peak"] - base,
                        "excess": phase["peak"] - base - done_bytes})
        now = time.perf_counter()
        if now - last_note > 2.0 or i + 1 == len(steps):
            last_note = now
            probe.progress(f"{i + 1}/{len(steps)} {what}, {done_bytes / 2**30:.2f} GiB real")
    result["seconds"] = sum(r["seconds"] for r in records)
    result["steps"] = records
    result["largest_step"] = max(r["bytes"] for r in records)
    worst = max(records, key=lambda r: r["excess"])
    result["max_excess"] = worst["excess"]
    result["max_excess_at"] = worst["name"]


def _is_deferred(t: torch.Tensor) -> bool:
    import torchdefer

    return torchdefer.is_deferred(t)


def units(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """The model cut into forward-order units: each element of a layer list, else each child.

    A child that holds a ``ModuleList``/``Sequential`` somewhere inside is cut
    further; any other child is one unit. Tensors owned directly by ``model``
    are not covered (Llama and the stack have none).
    """
    out: list[tuple[str, nn.Module]] = []
    for name, child in model.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, (nn.ModuleList, nn.Sequential)):
            for sub_name, sub in child.named_children():
                out.append((f"{path}.{sub_name}", sub))
        elif any(isinstance(m, (nn.ModuleList, nn.Sequential)) for m in child.modules()):
            out.extend(units(child, f"{path}."))
        else:
            out.append((path, child))
    return out
