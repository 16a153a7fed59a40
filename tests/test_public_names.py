"""The top-level names resolved lazily are also visible to type checkers."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import torchdefer


def _type_checking_imports() -> dict[str, str]:
    tree = ast.parse(Path(torchdefer.__file__).read_text())
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    names.update({alias.name: stmt.module for alias in stmt.names})
    return names


def test_every_lazy_name_is_imported_for_type_checkers_from_where_it_resolves():
    seen = _type_checking_imports()
    assert seen == torchdefer._LAZY
    for name, module in seen.items():
        assert getattr(torchdefer, name) is getattr(importlib.import_module(module), name)
