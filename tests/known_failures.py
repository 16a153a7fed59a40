"""Tests that fail today for a class of issue 9 that another branch is fixing.

Each entry maps a test id to the class and the branch fixing it; ``conftest.py``
marks those tests ``xfail(strict=True)``, so a test that starts passing after
a merge fails loudly until its line is deleted here. Nothing else may be
listed: a failure of any other class is a bug to fix or to report.
Delete this file's entries (keep the empty dict) once the fixes are merged.
"""

KNOWN_FAILURES: dict[str, str] = {}
