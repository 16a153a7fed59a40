"""bench/bench_recording_cost.py stays runnable: one short run writes its report.

No time is asserted (results live in bench/results/); the run must complete,
count the ops it recorded, and write the report with its command.
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_recording_cost_bench_runs_and_writes_its_report(tmp_path):
    proc = subprocess.run(
        [sys.executable, "bench/bench_recording_cost.py", "--runs", "1", "--calls", "2",
         "--repeats", "1", "--profile", "3", "--out", str(tmp_path), "--name", "smoke"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert result["construction"]["ops"] > 1000  # the 70B Llama records thousands of ops
    assert all(row["deferred_init"] is not None for row in result["ops"])
    report = (tmp_path / "smoke.md").read_text()
    assert "bench/bench_recording_cost.py --runs 1" in report and "ncalls" in report
