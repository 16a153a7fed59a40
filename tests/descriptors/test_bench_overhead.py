"""The descriptor-overhead benchmark runs (a smoke run; timings live in bench/results)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import bench_descriptor_overhead


def test_overhead_benchmark_writes_its_report_with_the_targets(tmp_path):
    out = tmp_path / "overhead.md"
    text = bench_descriptor_overhead.main(["bench_descriptor_overhead.py", "--rounds", "1", "--calls", "5", "--out", str(out)])
    assert out.read_text() == text
    assert "| batch 8: the check itself | <= 10 µs |" in text
    assert "| torchdefer program (jit) |" in text
