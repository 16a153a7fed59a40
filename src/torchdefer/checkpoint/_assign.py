"""Then assign: turn checkpoint tensors into the module's tensors, all or nothing.

:func:`prepare` makes, for one module tensor, the exact real tensor it will
become (device, dtype, eager's strides, a storage of its own) without
touching the module; :class:`~torchdefer.checkpoint._install.Installation`
puts it in. The loader prepares every tensor first and installs only when all
were prepared, so a failure while reading or converting leaves the model as
it was.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from torchdefer.checkpoint._targets import TensorGroup
from torchdefer.errors import CheckpointMismatchError
from torchdefer.materialize._convert import cast
from torchdefer.materialize._swap import recorded_inference
from torchdefer.recorder._target import target_of
from torchdefer.recorder._tensor import DeferredTensor

__all__ = ["held_storages", "pick_tied", "prepare", "same_values", "tie_mismatch"]


def pick_tied(group: TensorGroup, names: list[str], values: Mapping[str, torch.Tensor],
              where: str) -> torch.Tensor:
    """The checkpoint's tensor for a tied group; refuse ties whose values differ.

    Values are compared bit for bit, so a tied pair whose values hold the same
    NaNs is the same tensor (``torch.equal`` alone would call it different).
    """
    loaded = values[names[0]]
    for other in names[1:]:
        if not same_values(values[other], loaded):
            raise tie_mismatch(names[0], other, where)
    return loaded


def tie_mismatch(first: str, other: str, where: str) -> CheckpointMismatchError:
    """The error for tied names ``first`` and ``other`` whose stored values differ."""
    return CheckpointMismatchError(
        f"'{first}' and '{other}' are the same (tied) tensor in the module, but "
        f"{where} holds different values for them. Untie them in the model "
        "(e.g. tie_word_embeddings=False) or drop one key from the checkpoint. "
        "Nothing was loaded."
    )


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaN equals the same NaN; 0.0 and -0.0 differ)."""
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return _bits(a).equal(_bits(b))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def prepare(group: TensorGroup, loaded: torch.Tensor, device: torch.device | None,
            dtype: torch.dtype | None, taken: set[tuple[torch.device, int]]) -> torch.Tensor:
    """The real tensor ``group``'s tensor becomes; the module is not touched.

    A deferred tensor becomes ``loaded`` itself when device, dtype and layout
    already match and no other module tensor takes its storage (no copy: the
    module shares the checkpoint's storage, as ``load_state_dict(...,
    assign=True)`` does), else a copy laid out with the strides eager
    construction gave (a transposed or broadcast stored tensor would make
    ``optimizer.step`` fail). ``taken`` collects the storages handed out, so
    two untied names stored as one tensor get a storage each. A real tensor
    is copied into at the install; here ``loaded`` is converted for that (the
    conversion allocates, so it happens before anything is changed).
    """
    target = group.tensor
    if not isinstance(target, DeferredTensor):
        with torch.no_grad():
            return loaded.detach().to(device=target.device, dtype=target.dtype)
    place = device or target.fake_device
    # The recorded layout, read without a call on the deferred tensor (each
    # would be recorded: ~0.1 ms, per tensor of a 1000-tensor checkpoint).
    meta = target_of(target).meta
    # The module's kind of tensor (an inference tensor only if recorded under
    # inference mode), whatever mode the file is read in: eager copies into
    # the parameter, which keeps its kind.
    inference = recorded_inference(target)
    if _unchanged(loaded, meta.dtype, place, dtype, inference):
        real = loaded.detach()  # what the conversion below returns, without its ~4 us
    else:
        with torch.no_grad(), torch.inference_mode(inference):
            real = cast(loaded.detach().to(device=place,
                                           dtype=_via(loaded.dtype, meta.dtype, dtype)), dtype)
    if _own_and_exact(real, meta.stride, taken) and real.is_inference() == inference:
        return real
    with torch.no_grad(), torch.inference_mode(inference):
        out = torch.empty_strided(real.shape, meta.stride, dtype=real.dtype, device=place)
        return out.copy_(real)


def _unchanged(loaded: torch.Tensor, module: torch.dtype, place: torch.device,
               final: torch.dtype | None, inference: bool) -> bool:
    """Whether converting ``loaded`` for the module changes nothing (dtype, device,
    kind of tensor), outside inference mode (where views are made otherwise)."""
    return (loaded.dtype == module and (final is None or final == module)
            and loaded.device == place and not inference and not loaded.is_inference()
            and not torch.is_inference_mode_enabled())


# Conversions that keep every value: going through them before ``dtype=`` gives
# the bits of converting straight to ``dtype`` (a bf16 checkpoint loaded into
# an fp32 module with dtype=bfloat16 is not copied twice).
_EXACT = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
          (torch.float16, torch.float64), (torch.bfloat16, torch.float64),
          (torch.float32, torch.float64)}


def _via(stored: torch.dtype, module: torch.dtype, final: torch.dtype | None) -> torch.dtype:
    """The dtype to read into: the module's (as ``copy_`` would), or ``final`` when
    the stored values pass through the module's dtype unchanged."""
    if final is not None and (stored, module) in _EXACT:
        return final
    return module


def held_storages(tensors) -> set[tuple[torch.device, int]]:
    """The storages that real tensors among ``tensors`` (a module's) hold: a
    deferred tensor loaded from one of them gets a copy, as eager (which copies
    into its own parameter) gives it, never the other tensor's memory."""
    held = set()
    for t in tensors:
        if isinstance(t, DeferredTensor) or t.is_meta or t.numel() == 0:
            continue
        try:
            held.add((t.device, t.untyped_storage().data_ptr()))
        except (RuntimeError, NotImplementedError):  # a wrapper subclass without storage
            continue
    return held


def _own_and_exact(real: torch.Tensor, stride: tuple[int, ...],
                   taken: set[tuple[torch.device, int]]) -> bool:
    if real.numel() == 0:
        return True
    key = (real.device, real.untyped_storage().data_ptr())
    exact = (
        key not in taken
        and real.storage_offset() == 0
        and real.untyped_storage().nbytes() == real.numel() * real.element_size()
        and all(a == b for a, b, n in zip(real.stride(), stride, real.shape) if n > 1)
    )
    taken.add(key)
    return exact
