"""The package structure docs/ARCHITECTURE.md describes, checked from the source.

Four rules, read with ``ast`` from ``src/torchdefer`` (nothing is imported):

* no import circle inside a package is larger than three files;
* imports between packages point down the table of docs/ARCHITECTURE.md
  ("Packages and the one-way rule");
* no package reads another package's private fields (``t._value`` where
  ``_value`` is set in another package): between packages, only public doors;
* a module whose name has no leading ``_`` is public (users import it by path):
  it is listed in PUBLIC_MODULES and in docs/ARCHITECTURE.md's "Public modules".

An import inside a function counts as much as one at the top of a module: it
runs all the same, and hiding an import in a function does not remove the
dependency. Only imports under ``if TYPE_CHECKING:`` (which never run) are
left out of the circles; they still count for the one-way rule.

Today's known violations outside ``recorder/`` are listed in the allowlists
below, each naming what must change. An entry that no longer matches anything
fails the test too, so that each allowlist shrinks as the code is fixed.
"""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict
from dataclasses import dataclass

import networkx as nx

import torchdefer

SRC = pathlib.Path(torchdefer.__file__).parent

# The one-way rule (docs/ARCHITECTURE.md): what each package may import besides
# `_compat`, `errors` and `_hooks` (the registry of inversions, which imports
# only `errors`), which every package may use. The top-level modules
# (`torchdefer/__init__.py`, `_cli.py`, `__main__.py`) wire the packages together
# and may import any of them.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "_compat": frozenset(),
    "errors": frozenset(),
    "_hooks": frozenset(),
    "rng": frozenset(),
    "fake": frozenset(),
    "recorder": frozenset({"fake", "rng"}),
    "materialize": frozenset({"fake", "recorder", "rng"}),
    "checkpoint": frozenset({"fake", "recorder", "materialize", "rng"}),
    "distributed": frozenset({"fake", "recorder", "materialize", "checkpoint", "rng"}),
    "viz": frozenset({"recorder", "materialize", "rng"}),
    "descriptors": frozenset({"fake"}),
}
EVERYONE_MAY_IMPORT = frozenset({"_compat", "errors", "_hooks"})
TOP_LEVEL = "<top>"

# ---- today's known violations (the lead removes entries as branches land) ----

# package -> (the largest circle allowed there now, what must change).
CIRCLES_ALLOWED: dict[str, tuple[int, str]] = {}

# (importing package, imported package) -> what must change.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {}

# (reading package, private field) -> what must change.
PRIVATE_READS_ALLOWED: dict[tuple[str, str], str] = {}


# ---- reading the source ------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Import:
    source: str  # importing module, dotted
    target: str  # imported torchdefer module, dotted
    line: int
    where: str  # "module", "function" or "type" (under `if TYPE_CHECKING:`)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def package_of(module: str) -> str:
    """``recorder`` for ``torchdefer.recorder._graph``; ``errors`` for the errors module."""
    parts = module.split(".")
    if len(parts) == 1:
        return TOP_LEVEL
    if len(parts) == 2 and not MODULES[module].name == "__init__.py":
        name = parts[1]
        return name if name in MAY_IMPORT else TOP_LEVEL
    return parts[1]


def _resolve(name: str) -> str | None:
    """The torchdefer module ``name`` names (a module, or a name inside one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports_of(module: str, source: str | None = None) -> list[Import]:
    """The torchdefer imports of ``module`` (its file, or ``source`` given as its text)."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: list[Import] = []

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:
            up = package[: len(package) - node.level + 1]
            base = ".".join([*up, base] if base else up)
        # `from torchdefer.recorder import graph` names a module; `import x.y.z`, a module
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = "function" if where == "module" else where
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.body:
                    visit_one(sub, "type")
                for sub in child.orelse:
                    visit_one(sub, where)
                continue
            visit_one(child, inner)

    def visit_one(child: ast.AST, where: str) -> None:
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            for name in targets(child):
                target = _resolve(name) if name.startswith("torchdefer") else None
                if target is not None and target != module:
                    found.append(Import(module, target, child.lineno, where))
        inner = where
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = "function" if where == "module" else where
        visit(child, inner)

    text = path.read_text(encoding="utf-8") if source is None else source
    visit(ast.parse(text), "module")
    return found


IMPORTS = [imp for module in MODULES for imp in _imports_of(module)]


def circles_by_package() -> dict[str, list[set[str]]]:
    """Each package's import circles (strongly connected sets of its files), runtime
    imports only, module-level and function-level alike."""
    graph = nx.DiGraph()
    for imp in IMPORTS:
        same = package_of(imp.source) == package_of(imp.target) != TOP_LEVEL
        if same and imp.where != "type":
            graph.add_edge(imp.source, imp.target)
    found: dict[str, list[set[str]]] = defaultdict(list)
    for scc in nx.strongly_connected_components(graph):
        if len(scc) > 1:
            found[package_of(next(iter(scc)))].append(scc)
    return found


def _describe_circle(scc: set[str]) -> str:
    arrows = sorted(f"{i.source} -> {i.target} (line {i.line}, {i.where}-level)"
                    for i in IMPORTS if i.source in scc and i.target in scc)
    return "\n    ".join(arrows)


# ---- the rules -----------------------------------------------------------------

def test_no_import_circle_in_a_package_is_larger_than_three_files():
    circles = circles_by_package()
    problems = []
    for package, sccs in sorted(circles.items()):
        allowed, why = CIRCLES_ALLOWED.get(package, (3, ""))
        for scc in sccs:
            if len(scc) > allowed:
                problems.append(f"{package}: a circle of {len(scc)} files (allowed: {allowed}"
                                f"{'; ' + why if why else ''}):\n    {_describe_circle(scc)}")
    assert not problems, (
        "Import circles larger than 3 files (break them by moving code to where it "
        "belongs; an import moved into a function still counts):\n" + "\n".join(problems))


def test_every_allowed_circle_still_exists_at_its_allowed_size():
    circles = circles_by_package()
    stale = []
    for package, (allowed, _) in CIRCLES_ALLOWED.items():
        largest = max((len(scc) for scc in circles.get(package, [])), default=0)
        if largest < allowed:
            stale.append(f"{package}: allowed {allowed}, largest now {largest}")
    assert not stale, ("CIRCLES_ALLOWED in tests/test_package_structure.py is larger than needed: "
                       "lower or remove these entries: " + "; ".join(stale))


def test_the_recorder_has_no_allowance():
    # The recorded graph's package is the model for the others: no entry, ever.
    assert "recorder" not in CIRCLES_ALLOWED
    assert not [k for k in UPWARD_ALLOWED if "recorder" == k[0]]
    assert not [k for k in PRIVATE_READS_ALLOWED if "recorder" == k[0]]


def _upward_imports() -> dict[tuple[str, str], list[Import]]:
    found: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in IMPORTS:
        source, target = package_of(imp.source), package_of(imp.target)
        if source in (TOP_LEVEL, target) or target in EVERYONE_MAY_IMPORT:
            continue
        if target == TOP_LEVEL or target not in MAY_IMPORT[source]:
            found[(source, target)].append(imp)
    return found


def test_imports_between_packages_point_down_the_architecture_table():
    problems = [f"{source} imports {target}: " + ", ".join(
        f"{i.source} line {i.line} ({i.where}-level) -> {i.target}" for i in imps)
        for (source, target), imps in sorted(_upward_imports().items())
        if (source, target) not in UPWARD_ALLOWED]
    assert not problems, ("Imports against the one-way rule of docs/ARCHITECTURE.md:\n"
                          + "\n".join(problems))


def test_every_allowed_upward_import_still_exists():
    stale = sorted(set(UPWARD_ALLOWED) - set(_upward_imports()))
    assert not stale, f"remove these entries from UPWARD_ALLOWED: {stale}"


def _private_fields_set() -> dict[str, set[str]]:
    """Package -> the private fields its classes declare: ``self._name = ...`` (or
    ``cls.``) in a method, a class-level name or annotation, a ``__slots__`` entry."""
    owned: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        fields = owned[package_of(module)]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    fields.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    fields.update(_class_level_names(item))
    return {package: {f for f in fields if _is_private(f)} for package, fields in owned.items()}


def _class_level_names(item: ast.stmt) -> list[str]:
    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
        return [item.target.id]
    if not isinstance(item, ast.Assign):
        return []
    names = [t.id for t in item.targets if isinstance(t, ast.Name)]
    if "__slots__" in names and isinstance(item.value, (ast.Tuple, ast.List)):
        names += [e.value for e in item.value.elts
                  if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return names


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_reads() -> dict[tuple[str, str], list[str]]:
    """(package, field) -> where the package reads a private field another package owns
    (of an object not its own: ``self._x`` and ``cls._x`` are the class's own)."""
    owned = _private_fields_set()
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, path in MODULES.items():
        package = package_of(module)
        if package == TOP_LEVEL:
            continue
        others = set().union(*(f for p, f in owned.items() if p not in (package, TOP_LEVEL)))
        foreign = others - owned[package]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute) or node.attr not in foreign:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found[(package, node.attr)].append(f"{module}:{node.lineno}")
    return found


def test_no_package_reads_another_packages_private_fields():
    problems = [f"{package} reads {field} (owned elsewhere) at {', '.join(sites)}"
                for (package, field), sites in sorted(_private_reads().items())
                if (package, field) not in PRIVATE_READS_ALLOWED]
    assert not problems, ("Private fields read across packages (use or add a public door):\n"
                          + "\n".join(problems))


def test_every_allowed_private_read_still_exists():
    stale = sorted(set(PRIVATE_READS_ALLOWED) - set(_private_reads()))
    assert not stale, f"remove these entries from PRIVATE_READS_ALLOWED: {stale}"


# ---- public and internal modules -------------------------------------------------

# The modules users import by path (docs/ARCHITECTURE.md, "Public modules"); every
# other module's name starts with `_` (package `__init__`s aside).
PUBLIC_MODULES = frozenset({
    "torchdefer.errors",
    "torchdefer.materialize.progress",
    "torchdefer.materialize.concurrent",
    "torchdefer.distributed.shard",
    "torchdefer.rng.draws",
    "torchdefer.rng.mt19937",
    "torchdefer.rng.philox",
    "torchdefer.rng.cuda_increments",
})
# Internal, but other branches were changing them when the rest were renamed
# (issue 22 item 6): module -> its name to come.
NOT_YET_RENAMED: dict[str, str] = {}
ARCHITECTURE = SRC.parent.parent / "docs" / "ARCHITECTURE.md"


def _outside_underscore() -> set[str]:
    """Modules whose own name has no leading `_`, outside `_compat` (internal as a whole)."""
    return {m for m, path in MODULES.items()
            if path.name not in ("__init__.py", "__main__.py")
            and not any(part.startswith("_") for part in m.split(".")[1:])}


def test_every_module_is_internal_or_listed_as_public():
    unlisted = sorted(_outside_underscore() - PUBLIC_MODULES - set(NOT_YET_RENAMED))
    assert not unlisted, (
        f"modules without a leading `_` that are not public: {unlisted}. Users import a "
        "module without `_` by path: rename an internal one to `_name.py`, or list a public "
        "one in PUBLIC_MODULES and in docs/ARCHITECTURE.md's \"Public modules\"")
    stale = sorted((PUBLIC_MODULES | set(NOT_YET_RENAMED)) - _outside_underscore())
    assert not stale, f"listed but gone or renamed, remove: {stale}"


def test_every_public_module_is_documented_with_all_and_a_docstring():
    architecture = ARCHITECTURE.read_text(encoding="utf-8")
    for module in sorted(PUBLIC_MODULES):
        tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"{module} has no docstring"
        assert any(isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets) for n in tree.body), (
            f"{module} has no __all__")
        assert f"`{module}`" in architecture, f"docs/ARCHITECTURE.md does not list {module}"


# ---- the checker itself ----------------------------------------------------------

def test_the_checker_sees_imports_inside_functions_relative_ones_and_type_only_ones():
    source = """
from typing import TYPE_CHECKING
from . import _record
from ._mode import suspended
import torchdefer.recorder._tensor
if TYPE_CHECKING:
    from torchdefer.recorder._rng_placement import RngRecorder
def f():
    from torchdefer.viz import _dot
class C:
    def m(self):
        import torchdefer.materialize._api
"""
    seen = {(i.target, i.where) for i in _imports_of("torchdefer.recorder._graph", source)}
    assert seen == {
        ("torchdefer.recorder._record", "module"),
        ("torchdefer.recorder._mode", "module"),
        ("torchdefer.recorder._tensor", "module"),
        ("torchdefer.recorder._rng_placement", "type"),
        ("torchdefer.viz._dot", "function"),
        ("torchdefer.materialize._api", "function"),
    }
    assert package_of("torchdefer.recorder._graph") == "recorder"
    assert package_of("torchdefer.errors") == "errors"
    assert package_of("torchdefer") == TOP_LEVEL
