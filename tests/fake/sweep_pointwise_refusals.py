"""The full sweep behind ``test_pointwise_refusal_sweep.py`` (minutes, not in the suite).

Every pointwise aten overload on eight dtypes, three scalars and four dtypes
of the other tensors, eager vs ``deferred_init``::

    PYTHONPATH=tests/fake .venv/bin/python tests/fake/sweep_pointwise_refusals.py

Prints each overload whose outcome differs once. 2026-11-26, torch 2.13:
23,904 calls, 0 differ.
"""

import itertools
import warnings

import torch
from test_pointwise_refusal_sweep import _outcome, _sweepable

import torchdefer

DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.complex64)
SCALARS = (2, 2.5, True)
OTHERS = (None, torch.bool, torch.int64, torch.float32)  # None: the first tensor's dtype


def main() -> None:
    calls, differ = 0, {}
    for (op, kinds), dtype, scalar, other in itertools.product(
            list(_sweepable()), DTYPES, SCALARS, OTHERS):
        dtypes = iter([dtype] + [other or dtype] * len(kinds))

        def build(kinds=kinds, dtypes=tuple(dtypes), scalar=scalar, op=op):
            each = iter(dtypes)
            return op(*[(torch.arange(1, 4) % 2 + 1).to(next(each)) if k == "Tensor" else scalar
                        for k in kinds])

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eager = _outcome(build)
            deferred = _outcome(lambda build=build: torchdefer.deferred_init(build))
        calls += 1
        if eager[0] != deferred[0] or (eager[0] == "ok" and eager[1] != deferred[1]):
            differ.setdefault(str(op), (dtype, scalar, other, eager, deferred))
    print(f"{calls} calls; {len(differ)} overloads differ")
    for name, case in differ.items():
        print(name, *case)


if __name__ == "__main__":
    main()
