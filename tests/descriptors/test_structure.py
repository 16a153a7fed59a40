"""The package's shape: modules import one way (private torch APIs: tests/test_compat.py)."""

import ast
from pathlib import Path

import torchdefer.descriptors

PACKAGE = Path(torchdefer.descriptors.__file__).parent
PREFIX = "torchdefer.descriptors"


def imports(path):
    """Package modules a module imports, at top level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            names = [node.module] if node.module != PREFIX else [f"{PREFIX}.{a.name}" for a in node.names]
            out.update(n.split(".")[2] for n in names if n.count(".") >= 2)
    return out


def test_package_modules_import_each_other_without_cycles():
    graph = {p.stem: imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    done, stack = set(), []

    def visit(name):
        assert name not in stack, f"import cycle: {' -> '.join([*stack, name])}"
        if name in done:
            return
        stack.append(name)
        for dep in graph.get(name, ()):
            visit(dep)
        stack.pop()
        done.add(name)

    for name in graph:
        visit(name)

