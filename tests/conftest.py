import sys
from pathlib import Path

# `parity.py` holds the shared eager-vs-deferred comparisons.
sys.path.insert(0, str(Path(__file__).parent))
