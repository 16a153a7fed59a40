import sys
from pathlib import Path

import pytest

# `parity.py` holds the shared eager-vs-deferred comparisons.
sys.path.insert(0, str(Path(__file__).parent))

from known_failures import KNOWN_FAILURES


def pytest_collection_modifyitems(config, items):
    # Known failures of classes other branches are fixing (known_failures.py).
    for item in items:
        reason = KNOWN_FAILURES.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=f"known, being fixed: {reason}", strict=True))
