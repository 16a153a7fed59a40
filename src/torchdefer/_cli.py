"""``python -m torchdefer inspect | save-init``: build a model deferred, look at it, write it.

``inspect`` builds ``PACKAGE.MODULE:CALLABLE`` with :func:`torchdefer.deferred_init`,
prints what it would need, draws its recorded graph and explains parameters;
``--materialize`` then creates its weights. ``save-init`` builds it the same
way and streams its initial weights to a checkpoint directory with
:func:`torchdefer.save_state_dict`. The help texts are plain text, as a
terminal shows them.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import json
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

import torch
from torch import nn

from torchdefer._compat.patch import KEEP, patched, setting

__all__ = ["main"]

DESCRIPTION = """\
Build PACKAGE.MODULE:CALLABLE with torchdefer.deferred_init (nothing is
allocated), print its module tree with parameter counts and the bytes it would
need per device and dtype, write the recorded graph (--dot FILE: .dot, .svg,
.png by extension), explain parameters by name (--explain NAME), and
optionally materialize it (--materialize DEVICE, with a progress bar)."""

EXAMPLES = """\
examples:
  python -m torchdefer inspect torch.nn:Linear --kwargs '{"in_features": 4, "out_features": 2}'

  python -m torchdefer inspect transformers:LlamaForCausalLM \\
      --config-class transformers:LlamaConfig \\
      --config '{"hidden_size": 8192, "num_hidden_layers": 80}' \\
      --dot llama.svg --explain model.layers.3.mlp.down_proj.weight"""


SAVE_DESCRIPTION = """\
Build PACKAGE.MODULE:CALLABLE with torchdefer.deferred_init (nothing is
allocated) and write the initial weights eager construction would give
(bit for bit, after --seed) to the directory --out, one tensor at a time:
a Hugging Face safetensors directory (loadable by from_pretrained; with
config.json for a transformers model) or a torch.distributed.checkpoint
directory (a torchtitan seed checkpoint). Peak memory is about the largest
tensor. A transformers model class finds its config class itself
(--config-class is then optional); --config is JSON or a .json file."""

SAVE_EXAMPLES = """\
examples:
  python -m torchdefer save-init transformers:LlamaForCausalLM --config cfg.json \\
      --out llama-init --dtype bfloat16 --format safetensors --seed 0

  python -m torchdefer save-init torch.nn:Linear \\
      --kwargs '{"in_features": 4, "out_features": 2}' --out seed --format dcp"""


class CliError(Exception):
    """A mistake in the command line; the message says what to change."""


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failed, 2 bad usage).

    >>> from torchdefer._cli import main
    >>> main(["inspect", "torch.nn:Linear", "--kwargs", '{"in_features": 4, "out_features": 2}'])
    ... # doctest: +ELLIPSIS
    Built Linear...
    0
    """
    out = out or sys.stdout
    args = _parser().parse_args(argv)
    try:
        if args.command == "save-init":
            return _save_init(args, out)
        return _inspect(args, out)
    except CliError as e:
        print(f"torchdefer {args.command}: error: {e}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torchdefer",
        description="Build PyTorch models without allocating them, and look at them.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser(
        "inspect",
        help="build a model with deferred_init; print its tree, memory and provenance",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", metavar="PACKAGE.MODULE:CALLABLE",
                   help="what builds the model, e.g. torch.nn:Linear or "
                   "transformers:AutoModelForCausalLM.from_config")
    p.add_argument("--kwargs", default="{}", metavar="JSON",
                   help="keyword arguments for the callable, as a JSON object")
    p.add_argument("--config-class", metavar="PACKAGE.MODULE:CLASS",
                   help="build a config from --config and pass it as first argument")
    p.add_argument("--config", metavar="JSON", help="keyword arguments of --config-class")
    p.add_argument("--dtype", help="default dtype while building (e.g. bfloat16)")
    p.add_argument("--device", help="default device while building (e.g. cuda); "
                   "no GPU is needed, nothing is allocated")
    p.add_argument("--seed", type=int, help="torch.manual_seed before building")
    p.add_argument("--dot", metavar="FILE",
                   help="write the recorded graph: .dot/.gv (source), .svg, .png, .pdf")
    p.add_argument("--no-collapse", action="store_true",
                   help="draw every repeated submodule instead of one marked xN")
    p.add_argument("--max-nodes", type=int, metavar="N", help="draw at most N nodes")
    p.add_argument("--explain", action="append", default=[], metavar="NAME",
                   help="explain a parameter or buffer by name (repeatable)")
    p.add_argument("--materialize", metavar="DEVICE",
                   help="then materialize the model on DEVICE (e.g. cpu) and report the time")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar while materializing (default: when stderr is a terminal)")
    _save_parser(commands)
    return parser


def _save_parser(commands: Any) -> None:
    p = commands.add_parser(
        "save-init",
        help="build a model with deferred_init and write its initial weights, tensor by tensor",
        description=SAVE_DESCRIPTION,
        epilog=SAVE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", metavar="PACKAGE.MODULE:CALLABLE",
                   help="what builds the model, e.g. transformers:LlamaForCausalLM")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the directory to write (new or empty)")
    p.add_argument("--format", default="safetensors", choices=["safetensors", "dcp"],
                   help="safetensors (Hugging Face directory, default) or dcp "
                   "(torch.distributed.checkpoint)")
    p.add_argument("--dtype", help="write floating point tensors in this dtype "
                   "(e.g. bfloat16), as model.to(dtype) would")
    p.add_argument("--max-shard-size", default="50GB", metavar="SIZE",
                   help="safetensors: bytes per file, e.g. 5GB (default 50GB, as save_pretrained)")
    p.add_argument("--config", metavar="JSON|FILE",
                   help="config keyword arguments, as JSON or a .json file")
    p.add_argument("--config-class", metavar="PACKAGE.MODULE:CLASS",
                   help="the config class (default: the target's config_class, if it has one)")
    p.add_argument("--kwargs", default="{}", metavar="JSON",
                   help="keyword arguments for the callable, as a JSON object")
    p.add_argument("--seed", type=int, help="torch.manual_seed before building")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar while writing (default: when stderr is a terminal)")


def _inspect(args: argparse.Namespace, out: TextIO) -> int:
    import torchdefer
    from torchdefer.viz._summary import memory_table, module_tree

    start = time.perf_counter()
    model = _build(args, "inspect", args.dtype, args.device)
    if model is None:
        return 1
    took = time.perf_counter() - start
    explained = [(name, _tensor_named(model, name)) for name in args.explain]  # fail early
    ops = _op_count(model)
    print(f"Built {type(model).__name__} with deferred_init in {took:.2f} s: {ops} ops "
          "recorded, no tensor storage allocated.", file=out)
    print("\nModule tree (parameters):", file=out)
    print(module_tree(model), file=out)
    print("\nMemory it would need (shared storage counted once):", file=out)
    print(memory_table(model), file=out)
    status = 0
    if args.dot:
        status = _write_graph(model, args, out)
    for name, tensor in explained:
        print(f"\nProvenance of {name}:", file=out)
        print(torchdefer.explain(tensor, model), file=out)
    if args.materialize:
        _materialize(model, args.materialize, args.progress, out)
    return status


def _build(args: argparse.Namespace, command: str, dtype: str | None = None,
           device: str | None = None) -> nn.Module | None:
    """The model ``args`` describe, built with deferred_init; None (reported) if it raised."""
    import torchdefer

    fn = _load(args.target, "--target")
    call_args = []
    config_cls = None
    if args.config_class is not None:
        config_cls = _load(args.config_class, "--config-class")
    elif args.config is not None:
        # A transformers model class names its config class.
        config_cls = getattr(fn, "config_class", None)
        if not isinstance(config_cls, type):
            raise CliError("--config needs --config-class to say which class to build it "
                           f"with ({args.target} has no config_class)")
    if config_cls is not None:
        call_args.append(config_cls(**_json(_config_text(args.config), "--config")))
    kwargs = _json(args.kwargs, "--kwargs")

    def build() -> Any:
        # The defaults are set inside the recording and restored before it
        # ends, so they apply to the build only.
        with _defaults(dtype, device):
            return fn(*call_args, **kwargs)

    if args.seed is not None:
        torch.manual_seed(args.seed)
    try:
        model = torchdefer.deferred_init(build)
    except CliError:
        raise
    except Exception as e:
        traceback.print_exc()
        print(f"torchdefer {command}: building {args.target} with deferred_init failed: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return None
    if not isinstance(model, nn.Module):
        raise CliError(f"{args.target} returned {type(model).__name__}, not an nn.Module")
    return model


def _config_text(config: str | None) -> str:
    """--config as JSON text: read from the file it names, if it names one."""
    if config is None:
        return "{}"
    if not config.lstrip().startswith("{"):
        try:
            with open(config, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise CliError(f"--config {config!r} is neither a JSON object nor a readable "
                           f"file: {e}") from e
    return config


def _save_init(args: argparse.Namespace, out: TextIO) -> int:
    import torchdefer

    dtype = None
    if args.dtype is not None:
        dtype = getattr(torch, args.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise CliError(f"--dtype {args.dtype!r} is not a torch dtype (e.g. bfloat16)")
    given: str = args.max_shard_size
    size: int | str = int(given) if given.isdigit() else given
    start = time.perf_counter()
    model = _build(args, "save-init")
    if model is None:
        return 1
    built = time.perf_counter() - start
    try:
        path = torchdefer.save_state_dict(model, args.out, format=args.format, dtype=dtype,
                                          max_shard_size=size, progress=args.progress)
    except torchdefer.TorchdeferError as e:
        print(f"torchdefer save-init: {e}", file=sys.stderr)
        return 1
    took = time.perf_counter() - start - built
    files = sorted(p.name for p in path.iterdir())
    nbytes = sum((path / f).stat().st_size for f in files)
    seed = "the default seed" if args.seed is None else f"seed {args.seed}"
    print(f"Built {type(model).__name__} with deferred_init in {built:.2f} s ({seed}); wrote "
          f"{nbytes / 2**20:,.1f} MiB in {len(files)} files to {path.resolve()} "
          f"({args.format}) in {took:.2f} s.", file=out)
    return 0


def _materialize(model: nn.Module, device: str, progress: bool | None, out: TextIO) -> None:
    import torchdefer

    try:
        target = torch.device(device)
    except RuntimeError as e:
        raise CliError(f"--materialize {device!r} is not a torch device: {e}") from e
    start = time.perf_counter()
    torchdefer.materialize_module(model, target, progress=progress)
    took = time.perf_counter() - start
    unique = {id(t): t for t in (*model.parameters(), *model.buffers())}.values()
    nbytes = sum(t.numel() * t.element_size() for t in unique)
    print(f"\nMaterialized on {target} in {took:.2f} s: {nbytes / 2**20:,.1f} MiB of "
          "parameters and buffers.", file=out)


def _write_graph(model: nn.Module, args: argparse.Namespace, out: TextIO) -> int:
    from torchdefer.viz import GraphvizNotFoundError, write_graph
    from torchdefer.viz._dot import picture_to_dot
    from torchdefer.viz._picture import build_picture

    try:
        picture = build_picture(model, collapse_repeats=not args.no_collapse,
                                max_nodes=args.max_nodes)
        dot = picture_to_dot(picture, type(model).__name__)
        path = write_graph(dot, args.dot)
    except GraphvizNotFoundError as e:
        print(f"torchdefer inspect: {e} (e.g. --dot {args.dot.rsplit('.', 1)[0]}.dot)",
              file=sys.stderr)
        return 1
    except ValueError as e:
        raise CliError(str(e)) from e
    drawn = sum(1 for item in picture.items.values() if item.attrs.get("seq") is not None)
    notes = [f"{drawn} ops drawn"]
    if picture.repeats:
        runs = len(picture.repeats)
        notes.append(f"{picture.folded} more folded into {runs} repeated module "
                     f"cluster{'s' if runs > 1 else ''}")
    if picture.elided:
        notes.append(f"{picture.elided} left out by --max-nodes")
    unused = _op_count(model) - drawn - picture.folded - picture.elided
    if unused > 0:
        notes.append(f"{unused} recorded ops no parameter or buffer needs are not drawn")
    print(f"\nGraph written to {path.resolve()} ({', '.join(notes)})", file=out)
    return 0


def _op_count(model: nn.Module) -> int:
    graphs = {}
    for t in [*model.parameters(), *model.buffers()]:
        graph = getattr(t, "_graph", None)
        if graph is not None:
            graphs[id(graph)] = graph
    return sum(g.op_count for g in graphs.values())


def _load(spec: str, option: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"{option} {spec!r} must look like PACKAGE.MODULE:NAME, e.g. "
                       "torch.nn:Linear")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise CliError(f"cannot import {module_name!r} (from {spec!r}): {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"{module_name!r} has no attribute {attr!r} (from {spec!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise CliError(f"{spec!r} is a {type(obj).__name__}, not something callable")
    return obj


def _json(text: str, option: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise CliError(f"{option} is not valid JSON ({e}): {text!r}") from e
    if not isinstance(value, dict):
        raise CliError(f"{option} must be a JSON object of keyword arguments, got {text!r}")
    return value


@contextlib.contextmanager
def _defaults(dtype: str | None, device: str | None) -> Iterator[None]:
    """The default dtype and device while building, restored afterwards."""
    value = KEEP
    if dtype is not None:
        value = getattr(torch, dtype, None)
        if not isinstance(value, torch.dtype) or not value.is_floating_point:
            raise CliError(f"--dtype {dtype!r} is not a floating torch dtype "
                           "(e.g. float32, bfloat16, float16)")
    with patched(setting(torch.get_default_dtype, torch.set_default_dtype), value):
        if device is None:
            yield
        else:
            try:
                context = torch.device(device)
            except RuntimeError as e:
                raise CliError(f"--device {device!r} is not a torch device: {e}") from e
            with context:
                yield


def _tensor_named(model: nn.Module, name: str) -> torch.Tensor:
    named: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    if name in named:
        return named[name]
    close = difflib.get_close_matches(name, list(named), n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise CliError(f"--explain {name!r}: {type(model).__name__} has no parameter or buffer "
                   f"of that name.{hint}")
