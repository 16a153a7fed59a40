"""bench/bench_parallel.py stays runnable: one short run writes its report.

No time is asserted (results live in bench/results/parallel.md); the run must
complete, every case's weights must equal eager's bit for bit, and the report
must give its command.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_parallel_bench_runs_and_writes_its_report(tmp_path):
    out = tmp_path / "parallel.md"
    proc = subprocess.run(
        [sys.executable, "bench/bench_parallel.py", "--model", "llama-tiny", "--repeat", "1",
         "--threads", "2", "--sizes", "65536", "--rate-elements", "1048576",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = out.read_text()
    assert "bench/bench_parallel.py --model llama-tiny" in report
    rows = [line for line in report.splitlines() if line.startswith(("| eager", "| threads="))]
    assert len(rows) == 2 and all("| yes |" in line for line in rows)
