"""``Bound``: a module that calls the target with value-specialized leaves baked in.

Both export and the jit trace fallback record one call of the target; they
pass only the dynamic leaves (tensors, ``int`` lengths) and let this wrapper
rebuild the full call, so value-specialized arguments are Python constants
to the recorder and the branches they decide vanish.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import torch

from torchdefer.descriptors.specialization import Specialization
from torchdefer.descriptors.tree import rebuild

__all__ = ["Bound", "leaf_names"]


class Bound(torch.nn.Module):
    """Calls the target with value-specialized leaves baked in.

    Shares the target's parameter/buffer/submodule dicts, so export lifts the
    weights under the target's own names (``layers.0.weight``, not
    ``target.layers.0.weight``) and the graph reads like the model.
    """

    def __init__(self, target: Callable[..., Any], spec: Specialization) -> None:
        super().__init__()
        if isinstance(target, torch.nn.Module):
            for attr in ("_parameters", "_buffers", "_modules"):
                object.__setattr__(self, attr, getattr(target, attr))
            self.training = target.training
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_spec", spec)
        # Export names graph inputs after forward's parameters: give it one
        # parameter per dynamic leaf, named after the leaf (x, inp_b_1).
        self.input_names = leaf_names([path for path, _ in spec.dynamic_leaves()])
        call = self.call_target

        def forward(*dynamic: Any) -> Any:
            return call(*dynamic)

        forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in self.input_names]
        )
        self.forward = forward

    def call_target(self, *dynamic: Any) -> Any:
        """Call the target with ``dynamic`` (the dynamic leaves, in order) and the values."""
        stream = iter(dynamic)
        args, kwargs = [], {}
        for p in self._spec.signature.parameters:
            if p.name not in self._spec.trees:
                continue
            value = rebuild(self._spec.trees[p.name], stream)
            if p.positional:
                args.append(value)
            else:
                kwargs[p.name] = value
        return self._target(*args, **kwargs)


def leaf_names(paths: list[str]) -> list[str]:
    """Python identifiers for leaf paths (``inp['b'][1]`` -> ``inp_b_1``), unique."""
    names: list[str] = []
    for path in paths:
        base = re.sub(r"\W+", "_", path).strip("_") or "arg"
        base = base if base.isidentifier() else f"arg_{base}"
        name, k = base, 1
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.append(name)
    return names
