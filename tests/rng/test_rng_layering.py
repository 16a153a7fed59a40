"""rng is the one home of RNG accounting and sits below recorder and materialize."""

import ast
from pathlib import Path

import torchdefer
import torchdefer.rng

ROOT = Path(torchdefer.__file__).parent


def _imported(path: Path) -> set[str]:
    """torchdefer modules ``path`` imports, at top level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchdefer"):
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("torchdefer"))
    return out


def test_rng_imports_neither_recorder_nor_materialize_nor_anything_above():
    above = ("recorder", "materialize", "fake", "viz", "descriptors", "distributed", "checkpoint")
    for path in sorted((ROOT / "rng").glob("*.py")):
        wrong = {m for m in _imported(path) if m.split(".")[1:2] and m.split(".")[1] in above}
        assert not wrong, f"{path.name} imports {sorted(wrong)}"


def test_stream_positions_and_states_live_in_rng_only():
    # The accounting moved here (issue 19 item 5); no second copy elsewhere.
    for gone in ("recorder/stream.py", "recorder/states.py"):
        assert not (ROOT / gone).exists()
    defined = {}
    for path in ROOT.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(path.relative_to(ROOT).as_posix())
    for name in ("Stream", "Epoch", "Layout", "Position", "RngStates", "RngLedger"):
        assert defined.get(name) == [p for p in defined.get(name, []) if p.startswith("rng/")], name
        assert defined.get(name), name
