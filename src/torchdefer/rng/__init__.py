"""Generator arithmetic: where a random op leaves a generator, and getting there fast.

``mt19937`` moves the CPU generator any number of words ahead by GF(2)
polynomial jump-ahead (``gf2``); ``philox`` computes CUDA offsets and
``cuda_increments`` is the table of how far each random op moves them (from
PyTorch's CUDA kernels); ``draws`` is the measured model of how far each
random op moves the CPU generator. This
package knows nothing of recordings: ``recorder`` and ``materialize`` use it.
"""

from torchdefer.rng.draws import Effect, effect, known_random_op
from torchdefer.rng.mt19937 import advance, layout_known

__all__ = ["Effect", "advance", "effect", "known_random_op", "layout_known"]
