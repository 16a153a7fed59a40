"""Where each deferred parameter was registered while recording, to notice a tie broken later.

Weight tying makes one Parameter object the attribute of two modules
(``lm_head.weight is embed_tokens.weight``). Code that later replaces one of
them with a real tensor -- torch's own ``model.load_state_dict(sd,
assign=True)`` with a checkpoint that stores the tied weight once -- leaves
the other module holding the deferred parameter, which then materializes from
its recorded random init: the model is silently untied. Eager code has the
same outcome, but there the user sees it at once; here it surfaces only at
materialization, so :func:`warn_broken_ties` says so there, naming the tie.

Only registrations made while recording are watched, through torch's public
global parameter-registration hook, installed for the recording's duration.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator

import torch
from torch import nn

from torchdefer.recorder._tensor import DeferredTensor

__all__ = ["HOMES", "BrokenTieWarning", "warn_broken_ties", "watching_registrations"]

# The private attribute of a deferred parameter listing (module ref, name)
# of every module it was registered on while recording.
HOMES = "_homes"


class BrokenTieWarning(UserWarning):
    """A parameter tied while recording was replaced in one of its modules by a real tensor."""


@contextlib.contextmanager
def watching_registrations() -> Iterator[None]:
    """Note each module a deferred parameter is registered on, for the block's duration."""
    handle = nn.modules.module.register_module_parameter_registration_hook(_registered)
    try:
        yield
    finally:
        handle.remove()


def _registered(module: nn.Module, name: str, param: torch.Tensor | None) -> None:
    if isinstance(param, DeferredTensor):  # every parameter of a model: the first home at once
        homes = param.__dict__.get(HOMES)
        if homes is None:
            param.__dict__[HOMES] = [(weakref.ref(module), name)]
        elif not any(m() is module and n == name for m, n in homes):
            homes.append((weakref.ref(module), name))


def warn_broken_ties(param: DeferredTensor, path: str, root: nn.Module) -> None:
    """Warn if ``param``, about to be materialized as ``path``, lost a tie to a real tensor."""
    homes = param.__dict__.get(HOMES)
    if not homes or len(homes) < 2:
        return
    lost = []
    for ref, name in homes:
        module = ref()
        if module is None:
            continue
        now = module._parameters.get(name)
        replaced = now is not param and isinstance(now, torch.Tensor)
        if replaced and not isinstance(now, DeferredTensor):
            lost.append(_path_in(root, module, name))
    if lost:
        shown = ", ".join(repr(p) for p in lost)
        warnings.warn(
            f"{path!r} was tied to {shown} when the model was built, but {shown} has since "
            f"been replaced by a real tensor (torch's load_state_dict(..., assign=True) does "
            f"this with a checkpoint that stores the tied weight once). {path!r} is now "
            "materialized from its own recorded init, untied. To keep the tie, call the "
            "model's tie_weights() (Hugging Face) or re-assign the tied attribute before "
            "materializing, or load with torchdefer.load_state_dict, which keeps ties.",
            BrokenTieWarning,
            stacklevel=4,  # ties -> api._each_replayed -> materialize_module -> the user
        )


def _path_in(root: nn.Module, module: nn.Module, name: str) -> str:
    for prefix, candidate in root.named_modules(remove_duplicate=False):
        if candidate is module:
            return f"{prefix}.{name}" if prefix else name
    return f"{type(module).__name__}.{name}"
