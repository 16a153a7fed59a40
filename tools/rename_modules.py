"""Rewrite references to the modules issue 22 item 6 renamed (or folded away).

Run from the repository root on a tree that still names the old modules (a
branch started before the rename, after merging it):

    python tools/rename_modules.py [--mv] [paths...]

Without paths it rewrites src/, tests/, bench/, examples/, docs/, README.md,
CONTRIBUTING.md, pyproject.toml and the Makefile (never CHANGELOG.md, which is
history). ``--mv`` also ``git mv``s the files. Then run
``ruff check --fix --select I,F401`` to re-sort the imports it changed.
Merging such a branch: the conflicts are import blocks; keep both sides of each,
run this script and ruff, and fix by hand what is not an import (a docstring
line or a dict entry kept twice). A new module the branch added without a
leading ``_`` fails tests/test_package_structure.py: rename it, or list it there.
What it rewrites:

* dotted names ``torchdefer.pkg.mod`` (imports, strings, docstrings);
* ``from torchdefer.pkg import mod`` / ``from . import mod`` (as ``_mod as mod``);
* ``from .mod import x`` (relative imports);
* file paths ``pkg/mod.py``;
* in Markdown, and between backticks in Python, short forms ``pkg.mod``.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

# old dotted module -> new dotted module (a re-export shim folded away maps to
# where its names live).
RENAMES: dict[str, str] = {}


def _add(package: str, pairs: str) -> None:
    for pair in pairs.split():
        old, _, new = pair.partition(":")
        prefix = f"torchdefer.{package}." if package else "torchdefer."
        RENAMES[prefix + old] = new if new.startswith("torchdefer") else prefix + (new or "_" + old)


_add("", "cli:")
_add("_compat", "checkpoint:serialization")
_add("fake", "device:_output_device _devices:_cross_device layout: meta: mode: "
     "storage:_storage_objects tensor:")
_add("recorder", "_storage:_storage_versions rng:_rng_placement ambient: api: composite: context: external: graph: "
     "mode: reach: record: subclasses: target: tensor: ties: "
     "errors:torchdefer.errors source:torchdefer.fake._source")
_add("materialize", "errors:_error_context convert: local_call: plan: replay: swap: value: "
     "api: cache: parallel: rng:_rng_replay")
_add("checkpoint", "assign: dcp: install: load: module_rules: plan: safetensors_files: source: "
     "targets: torch_save: write: write_plan: "
     "errors:torchdefer.errors write_errors:torchdefer.errors")
_add("distributed", "checkpoint:_load columns: dtensor: fsdp1: module: rows: save:")
_add("viz", "dot: nx: picture: provenance: repeat: style: summary: target:")
_add("descriptors", "archive: checker: describe: export_backend: jit_backend: "
     "meta_tensor_type: object_of: outputs: program: tree: weights: errors:torchdefer.errors")
_add("rng", "bounds: chunks: gf2: ledger: ranges: rejection: states: stream: uniform_rejection:")

# Names a package re-exports that are also the old name of one of its modules:
# ``from torchdefer.recorder import composite`` imports the function, not the module.
FUNCTIONS = {"torchdefer.recorder.composite", "torchdefer.descriptors.describe"}

FOLDED = {old for old, new in RENAMES.items() if new.rpartition(".")[0] != old.rpartition(".")[0]}
MOVED = {old: new for old, new in RENAMES.items() if old not in FOLDED}


def _path(dotted: str) -> str:
    return dotted.removeprefix("torchdefer.").replace(".", "/") + ".py"


def _dotted_patterns() -> list[tuple[re.Pattern[str], str]]:
    out = []
    for old in sorted(RENAMES, key=len, reverse=True):
        out.append((re.compile(rf"(?<![\w.]){re.escape(old)}(?!\w)"), RENAMES[old]))
    return out


def _path_patterns() -> list[tuple[re.Pattern[str], str]]:
    out = []
    for old, new in MOVED.items():
        out.append((re.compile(rf"(?<![\w])(?<!tests/)(?<!bench/){re.escape(_path(old))}"),
                    _path(new)))
    return out


def _short_patterns(python: bool) -> list[tuple[re.Pattern[str], str]]:
    out = []
    for old in sorted(MOVED, key=len, reverse=True):
        short, new = old.removeprefix("torchdefer."), MOVED[old].removeprefix("torchdefer.")
        if "." not in short:
            continue
        before = r"(?<=[`~])" if python else r"(?<![\w./])"
        out.append((re.compile(before + re.escape(short) + r"(?![\w])"), new))
    return out


def _from_imports(text: str, module: str | None) -> str:
    """``from torchdefer.pkg import mod`` and relative forms, rewritten in place."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    package = module.rpartition(".")[0] if module else None
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str, str]] = []  # (line0, line1, old name, replacement)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            if package is None:
                continue
            up = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*up, base] if base else up)
        if node.level and base in RENAMES:  # from .mod import x
            edits.append((node.lineno - 1, node.end_lineno or node.lineno, "rel-module",
                          node.module or ""))
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if full in MOVED and full not in FUNCTIONS:
                new = MOVED[full].rpartition(".")[2]
                repl = f"{new} as {alias.name}" if alias.asname is None else new
                edits.append((node.lineno - 1, node.end_lineno or node.lineno, alias.name, repl))
    for first, last, name, repl in edits:
        chunk = "".join(lines[first:last])
        if name == "rel-module":
            old_rel = repl
            head = old_rel.split(".")[0]
            target = None
            for old, new in MOVED.items():
                if old.endswith("." + head) and old.rpartition(".")[0] == package:
                    target = new.rpartition(".")[2]
            if target is None:
                continue
            chunk = re.sub(rf"(from \.+){re.escape(head)}(?!\w)", rf"\g<1>{target}", chunk, count=1)
        else:
            chunk = re.sub(rf"(?<![\w.]){re.escape(name)}(?![\w.])", repl, chunk, count=1)
        lines[first:last] = [chunk] + [""] * (last - first - 1)
    return "".join(lines)


def rewrite(path: pathlib.Path, root: pathlib.Path) -> bool:
    text = path.read_text(encoding="utf-8")
    new = text
    python = path.suffix == ".py"
    if python:
        rel = path.relative_to(root).as_posix()
        module = None
        if rel.startswith("src/"):
            # a package's __init__ keeps its `.__init__`: its relative imports start there
            module = rel.removeprefix("src/").removesuffix(".py").replace("/", ".")
        new = _from_imports(new, module)
    for pattern, repl in _dotted_patterns() + _path_patterns() + _short_patterns(python):
        new = pattern.sub(repl, new)
    if new != text:
        path.write_text(new, encoding="utf-8")
        return True
    return False


DEFAULT = ["src", "tests", "bench", "examples", "docs", "README.md", "CONTRIBUTING.md",
           "pyproject.toml", "Makefile"]


def main(argv: list[str]) -> int:
    root = pathlib.Path.cwd()
    mv = "--mv" in argv
    paths = [a for a in argv if a != "--mv"] or DEFAULT
    if mv:
        for old, new in MOVED.items():
            if (root / "src/torchdefer" / _path(old)).exists():
                subprocess.run(["git", "mv", f"src/torchdefer/{_path(old)}",
                                f"src/torchdefer/{_path(new)}"], check=True)
        return 0
    files: list[pathlib.Path] = []
    for p in paths:
        q = root / p
        files += [q] if q.is_file() else [f for f in q.rglob("*")
                                          if f.suffix in (".py", ".md", ".toml", ".txt", ".cfg")
                                          and ".venv" not in f.parts and "results" not in f.parts
                                          and "reports" not in f.parts]
    if "Makefile" in paths:
        files.append(root / "Makefile")
    changed = [f for f in files if f.name != "CHANGELOG.md" and rewrite(f, root)]
    print(f"{len(changed)} files rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
