"""Vision model zoos, eager vs deferred, bit for bit (a script, not part of the suite).

torchvision and timm are not test dependencies: PyPI's torchvision is a CUDA
build pinned to one torch, and next to the CPU wheel its C++ ops fail to load
(which also breaks ``import transformers``). Install them into a scratch venv
(or temporarily, ``pip install --no-deps torchvision==<match> timm``), then::

    python tests/integration/zoo_sweep.py torchvision          # every builder
    python tests/integration/zoo_sweep.py timm --per-family 3  # smallest 3 per family

Each model is built after ``manual_seed(0)`` eagerly and under ``deferred_init``,
materialized and compared with ``parity.assert_same_module`` (values, dtype,
strides, requires_grad, Parameter-ness, tying, shared storage). Models above
``--max-params`` are only deferred (that they defer at all is checked too).
One JSON line per model goes to stdout.

Results (2026-11-24, torch 2.13.0 CPU, torchvision 0.28.0, timm 1.0.31):
torchvision: 116 of 121 builders compared (5 over 150M only deferred), all
equal. timm: all 1,371 models defer; 238 compared (``--max-params 30e6``: the
first 87 names, then ``--per-family 3`` over the 98 families), all equal.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: parity.py

import torchdefer
from parity import assert_same_module


def _import_torchvision():
    """torchvision, importable even where its C++ ops do not load (see above):
    its fake-kernel registrations for those ops are skipped; models need none."""
    import torch.library

    register_fake = torch.library.register_fake
    torch.library.register_fake = lambda *a, **k: (lambda f: f)
    try:
        import torchvision
    finally:
        torch.library.register_fake = register_fake
    return torchvision


def _builders(zoo: str, per_family: int, max_params: float):
    if zoo == "torchvision":
        tv = _import_torchvision()

        def make(name):
            try:  # detection and segmentation models download backbones by default
                return tv.models.get_model(name, weights=None, weights_backbone=None)
            except TypeError:
                return tv.models.get_model(name, weights=None)

        return sorted(tv.models.list_models()), make
    _import_torchvision()  # timm imports it
    import timm
    from timm.models import _registry

    def make(name):
        return timm.create_model(name, pretrained=False)

    names = sorted(timm.list_models())
    if not per_family:
        return names, make
    families = collections.defaultdict(list)
    for name in names:
        families[_registry._model_to_module.get(name, name.split("_")[0])].append(name)
    picked = []
    for members in families.values():
        sized = sorted((_deferred_params(make, n), n) for n in members)
        picked += [n for size, n in sized if size <= max_params][:per_family]
    return picked, make


def _deferred_params(make, name) -> int:
    model = torchdefer.deferred_init(make, name)
    return sum(p.numel() for p in model.parameters())


def check(make, name: str, max_params: float) -> dict:
    record: dict = {"name": name}
    start = time.perf_counter()
    try:
        torch.manual_seed(0)
        lazy = torchdefer.deferred_init(make, name)
        record["params"] = sum(p.numel() for p in lazy.parameters())
        if record["params"] > max_params:
            record["status"] = "deferred only (large)"
        else:
            torch.manual_seed(0)
            eager = make(name)
            assert_same_module(torchdefer.materialize_module(lazy), eager)
            record["status"] = "equal"
    except AssertionError as e:
        record["status"], record["detail"] = "DIFFERS", str(e)[:500]
    except torchdefer.TorchdeferError as e:
        record["status"], record["detail"] = "refused", str(e)[:500]
    except Exception as e:  # a sweep reports every failure and goes on
        record["status"], record["detail"] = "crash", f"{type(e).__name__}: {e}"[:500]
    record["seconds"] = round(time.perf_counter() - start, 2)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("zoo", choices=["torchvision", "timm"])
    parser.add_argument("--per-family", type=int, default=0, help="timm: smallest N per family")
    parser.add_argument("--max-params", type=float, default=150e6)
    parser.add_argument("--only", nargs="*", help="these model names only")
    args = parser.parse_args()
    names, make = _builders(args.zoo, 0 if args.only else args.per_family, args.max_params)
    names = args.only or names
    counts: collections.Counter = collections.Counter()
    for name in names:
        record = check(make, name, args.max_params)
        counts[record["status"]] += 1
        print(json.dumps(record), flush=True)
    print(json.dumps(dict(counts)), file=sys.stderr)


if __name__ == "__main__":
    main()
