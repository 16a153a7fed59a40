"""Print the fuzzer's stats (programs run, skipped, refused and why, failed by class)."""

from runner import REPORTS


def pytest_terminal_summary(terminalreporter):
    if REPORTS:
        terminalreporter.section("torchdefer fuzz stats")
        for report in REPORTS:
            terminalreporter.write_line(report.summary())
