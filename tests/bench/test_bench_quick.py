"""The benchmarks stay runnable: the quick suite end to end, and the pieces it trusts.

Nothing here asserts a time or a memory figure (those belong in
bench/results/, never in tests); the tests check that every case runs, the
report and plots are written, and that what the benchmark compares is sound.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.models import build_fn, spec_named  # noqa: E402


def test_quick_benchmark_runs_every_case_and_writes_report_and_plots(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    raw = json.loads((tmp_path / "results.json").read_text())
    outcomes = [o for suite in raw["outcomes"].values() for o in suite]
    assert outcomes and all(o["status"] == "ok" for o in outcomes)
    assert set(raw["outcomes"]) == {"construction", "materialization", "recording"}
    assert "[1/" in proc.stdout  # progress was shown

    # Every materialization order gave eager's bits (the report's "bitwise" column).
    materialized = raw["outcomes"]["materialization"]
    assert {o["case"]["mode"] for o in materialized} == {
        "eager", "materialize_module", "reverse tensors", "per submodule"}
    assert len({o["result"]["fingerprint"] for o in materialized}) == 1
    for o in materialized:
        steps = o["result"].get("steps", [])
        assert not steps or steps[-1]["done"] == sum(s["bytes"] for s in steps)

    report = (tmp_path / "results.md").read_text()
    for heading in ("## Targets", "## 1. Construction", "## 2. Materialization on CPU",
                    "## 3. Per-op recording overhead", "**Command**", "**Machine**",
                    "**Versions**"):
        assert heading in report
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "Plots skipped" in report
    else:
        pngs = sorted(p.name for p in tmp_path.glob("*.png"))
        assert pngs and all(f"]({name})" in report for name in pngs)
        assert all((tmp_path / name).read_bytes().startswith(b"\x89PNG") for name in pngs)


def test_fingerprint_changes_when_one_bit_of_one_weight_changes():
    from bench.fingerprint import fingerprint

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    before = fingerprint(model)
    assert fingerprint(model) == before
    with torch.no_grad():
        bits = model.weight.view(torch.int32)
        bits[7, 3] ^= 1
    assert fingerprint(model) != before


@pytest.mark.parametrize("name", ["llama-tiny", "llama-1b", "llama-70b", "stack-tiny"])
def test_zoo_parameter_counts_match_the_built_model(name):
    spec = spec_named(name)
    fn, args = build_fn(spec)
    with torch.device("meta"):
        model = fn(*args)
    assert spec.params == sum(p.numel() for p in model.parameters())


def test_zoo_sweep_names_give_the_same_shape_at_another_depth():
    base, deeper = spec_named("llama-70b"), spec_named("llama-70b-L10")
    assert (deeper.hidden, deeper.layers, deeper.vocab) == (base.hidden, 10, base.vocab)
    with pytest.raises(KeyError, match="known: llama-tiny"):
        spec_named("gpt-17")


def test_plots_are_skipped_with_a_note_without_matplotlib(tmp_path, monkeypatch):
    from bench.plots import write_plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    note = write_plots({}, tmp_path)
    assert isinstance(note, str) and "pip install matplotlib" in note
    assert not list(tmp_path.iterdir())
