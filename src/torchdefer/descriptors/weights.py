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

from torchdefer.descriptors._torch import FakeTensor
from torchdefer.fake import is_fake

__all__ = ["Weights", "has_data"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)


class Weights:
    """A source of named weights: a live module, a dict of tensors, or none.

    Args:
        module: read live, by name, on every call.
        tensors: fixed tensors (a loaded program, or ``with_weights(state_dict)``).
        missing: the message to raise when there is neither (a program loaded
            from a deferred model's save).
    """

    def __init__(self, module: torch.nn.Module | None = None,
                 tensors: Mapping[str, torch.Tensor] | None = None, missing: str = "") -> None:
        self.module, self.tensors, self.missing = module, tensors, missing

    def resolver(self, names: Sequence[str], metas: Sequence[tuple[torch.dtype, tuple[int, ...]]],
                 qualname: str) -> Callable[[], list[torch.Tensor]]:
        """A function returning the tensors for ``names`` as they are now.

        Args:
            names: dotted weight names in the graph's order.
            metas: ``(dtype, shape)`` each was traced with.
            qualname: the program's name, for messages.
        """
        if not names:
            return list
        if self.module is None and self.tensors is None:
            message = self.missing

            def refuse() -> list[torch.Tensor]:
                raise RuntimeError(message)

            return refuse
        slots = [(name, tuple(name.split(".")[:-1]), name.rpartition(".")[2], dtype,
                  torch.Size(shape))
                 for name, (dtype, shape) in zip(names, metas)]
        module, tensors = self.module, self.tensors

        def resolve() -> list[torch.Tensor]:
            out = []
            for name, owner, attr, dtype, shape in slots:
                try:
                    if module is None:
                        t = tensors[name]
                    else:
                        m = module
                        for part in owner:
                            m = m._modules[part]
                        d = m._parameters
                        t = d[attr] if attr in d else m._buffers[attr]
                except KeyError:
                    source = "the module" if module is not None else "the bound weights"
                    raise RuntimeError(
                        f"{qualname} program: its weight {name!r} is missing from {source}; "
                        "bind weights with every name the program needs, or script the model "
                        "again after changing its structure"
                    ) from None
                if t is None or (type(t) not in _PLAIN and not has_data(t)) or t.is_meta:
                    raise RuntimeError(
                        f"{qualname} program: weight {name!r} has no data (it is "
                        f"{'deferred' if t is not None and not t.is_meta else 'meta or None'}); "
                        "call torchdefer.materialize_module(model) first, or bind real weights "
                        "with program.with_weights(module_or_state_dict)"
                    )
                if t.dtype is not dtype or t.shape != shape:
                    raise RuntimeError(
                        f"{qualname} program: weight {name!r} is now {t.dtype} {list(t.shape)}, "
                        f"but the program was built for {dtype} {list(shape)}; script the model "
                        "again after changing its weights' dtype or shape"
                    )
                out.append(t)
            return out

        return resolve


def has_data(t: Any) -> bool:
    """Whether ``t`` holds real data: not meta, not deferred, not a torch fake tensor."""
    if t.is_meta:
        return False
    return type(t) in _PLAIN or not (is_fake(t) or isinstance(t, FakeTensor))
