"""Where a program reads its weights on each call.

A program built from a module runs with that module's weights as they are at
call time -- after ``materialize_module``, ``load_state_dict`` or a
reassigned ``nn.Parameter`` -- so they are looked up by name on every call
(dict lookups through ``_modules`` / ``_parameters`` / ``_buffers``, well
under a microsecond each), and checked to still have the dtype and shape the
graph was built for and to hold data (not deferred, not meta).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from torchdefer._compat.export import FakeTensor
from torchdefer.errors import StateError
from torchdefer.fake import is_fake

__all__ = ["Weights", "has_data", "lookup"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)


class Weights:
    """A source of named weights: a live module (read by name on every call),
    fixed tensors (a loaded program, ``with_weights(state_dict)``), or neither,
    when calls raise ``missing`` (a program loaded from a deferred model's save)."""

    def __init__(self, module: torch.nn.Module | None = None,
                 tensors: Mapping[str, torch.Tensor] | None = None, missing: str = "") -> None:
        self.module, self.tensors, self.missing = module, tensors, missing

    def resolver(self, names: Sequence[str], metas: Sequence[tuple[torch.dtype, tuple[int, ...]]],
                 qualname: str) -> Callable[[], list[torch.Tensor]]:
        """A function returning the tensors for ``names`` (dotted, in the graph's
        order) as they are now, checked against the ``(dtype, shape)`` traced."""
        if not names:
            return list
        slots = [(name, name.split(".")[:-1], name.rpartition(".")[2], dtype, torch.Size(shape))
                 for name, (dtype, shape) in zip(names, metas)]
        module, tensors, missing = self.module, self.tensors, self.missing

        def resolve() -> list[torch.Tensor]:
            if module is None and tensors is None:
                raise StateError(missing)
            out = []
            for name, owner, attr, dtype, shape in slots:
                try:
                    if module is not None:
                        t = lookup(module, owner, attr)[1]
                    else:  # tensors: both None was refused above
                        t = tensors[name]  # type: ignore[index]
                except KeyError:
                    source = "the module" if module is not None else "the bound weights"
                    raise StateError(
                        f"{qualname} program: its weight {name!r} is missing from {source}; "
                        "bind weights with every name the program needs, or script the model "
                        "again after changing its structure") from None
                if t is None or (type(t) not in _PLAIN and not has_data(t)) or t.is_meta:
                    raise StateError(
                        f"{qualname} program: weight {name!r} has no data (it is "
                        f"{'deferred' if t is not None and not t.is_meta else 'meta or None'}); "
                        "call torchdefer.materialize_module(model) first, or bind real weights "
                        "with program.with_weights(module_or_state_dict)")
                if t.dtype is not dtype or t.shape != shape:
                    raise StateError(
                        f"{qualname} program: weight {name!r} is now {t.dtype} {list(t.shape)}, "
                        f"but the program was built for {dtype} {list(shape)}; script the model "
                        "again after changing its weights' dtype or shape")
                out.append(t)
            return out

        return resolve


def lookup(module: torch.nn.Module, path: Sequence[str], attr: str) -> tuple[torch.nn.Module, Any]:
    """The submodule at ``path`` and its parameter or buffer ``attr``, by dict
    lookups (``get_submodule`` would cost microseconds on every call)."""
    for part in path:
        module = module._modules[part]  # type: ignore[assignment]  # a missing one raises
    d = module._parameters
    return module, d[attr] if attr in d else module._buffers[attr]


def has_data(t: Any) -> bool:
    """Whether ``t`` holds real data: not meta, not deferred, not a torch fake tensor."""
    if t.is_meta:
        return False
    return type(t) in _PLAIN or not (is_fake(t) or isinstance(t, FakeTensor))
