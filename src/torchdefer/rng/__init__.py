"""The generators: where each random call draws, and getting a generator there fast.

The one home of RNG accounting. ``_ledger`` places each random call in its
generator's stream and keeps the real generators where eager code leaves
them; ``_stream`` holds the streams, epochs and positions (words past an
anchor); ``_states`` gives the exact state at a position. Underneath:
``mt19937`` moves the CPU generator any number of words ahead by GF(2)
polynomial jump-ahead (``_gf2``); ``philox`` computes CUDA offsets and
``cuda_increments`` is the table of how far each random op moves them (from
PyTorch's CUDA kernels); ``draws`` is the measured model of how far each
random op moves the CPU generator. Those four are public by path
(docs/ARCHITECTURE.md, "Public modules"); the modules named ``_...`` are not.

This package imports neither ``recorder`` nor ``materialize``: what it needs of
them comes in as small types (``_stream.RandomCall``, ``_stream.CallReader``,
``_states.set_call_runner``). ``recorder`` places calls; ``materialize`` asks
for states and replays.
"""

from torchdefer.rng._ledger import RngLedger
from torchdefer.rng._states import CrossDeviceRestoreWarning, RngStates
from torchdefer.rng._stream import CallReader, Position, RandomCall, Stream
from torchdefer.rng._workers import kept_threads
from torchdefer.rng.draws import Effect, effect, known_random_op
from torchdefer.rng.mt19937 import advance, layout_known

__all__ = [
    "CallReader",
    "CrossDeviceRestoreWarning",
    "Effect",
    "Position",
    "RandomCall",
    "RngLedger",
    "RngStates",
    "Stream",
    "advance",
    "effect",
    "kept_threads",
    "known_random_op",
    "layout_known",
]
