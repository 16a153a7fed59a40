"""``copy.deepcopy`` and ``copy.copy`` of deferred tensors, as eager PyTorch does them, recorded.

Eager semantics kept:

* a Parameter (or a class with its own ``__deepcopy__``) is copied by its
  class's ``__deepcopy__``: ``nn.Parameter`` clones its data;
* any other tensor is copied with its *whole storage*, once per storage per
  ``deepcopy`` call (``memo``), so tensors that shared a storage share the
  copied one; non-leaf tensors are refused as in eager;
* ``memo`` keeps tying: one object copied twice is one copy;
* ``copy.copy`` gives a new tensor object over the same storage, with the same
  attributes.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from torchdefer.recorder._mode import recording
from torchdefer.recorder._subclasses import deferred_class, subclassing, user_class
from torchdefer.recorder._tensor import PRIVATE_ATTRIBUTES, DeferredTensor

__all__ = ["deepcopy_deferred", "shallow_copy_deferred", "user_attributes"]


def user_attributes(tensor: torch.Tensor) -> dict[str, Any]:
    return {k: v for k, v in tensor.__dict__.items() if k not in PRIVATE_ATTRIBUTES}


def deepcopy_deferred(tensor: DeferredTensor, memo: dict) -> torch.Tensor:

    if id(tensor) in memo:
        return memo[id(tensor)]
    own = getattr(user_class(tensor), "__deepcopy__", None)
    if own is not None and own is not torch.Tensor.__deepcopy__:
        # nn.Parameter's (clone), UninitializedParameter's, a library's own.
        with recording(tensor._graph), subclassing():
            return own(tensor, memo)
    return _tensor_deepcopy(tensor, memo)


def _tensor_deepcopy(tensor: DeferredTensor, memo: dict) -> torch.Tensor:
    """``torch.Tensor.__deepcopy__``: the storage copied once, the tensor set on it."""
    if not tensor.is_leaf:
        raise RuntimeError(
            "Only Tensors created explicitly by the user (graph leaves) support the "
            "deepcopy protocol at the moment.  If you were attempting to deepcopy a "
            "module, this may be because of a torch.nn.utils.weight_norm usage, see "
            "https://github.com/pytorch/pytorch/pull/103001"
        )
    with torch.no_grad():
        new = _in_copied_storage(tensor, memo)
    new.requires_grad_(tensor.requires_grad)
    if type(tensor) is not DeferredTensor:
        new.__class__ = type(tensor)
    new.__dict__.update(copy.deepcopy(user_attributes(tensor), memo))
    memo[id(tensor)] = new
    return new


def _in_copied_storage(tensor: DeferredTensor, memo: dict) -> torch.Tensor:
    nbytes = tensor.untyped_storage().nbytes()
    itemsize = tensor.element_size()
    if nbytes % itemsize:  # a storage viewed with several dtypes: copy this tensor only
        return tensor.clone(memory_format=torch.preserve_format).detach()
    key = ("torchdefer: storage copied by deepcopy", id(tensor._value.storage))
    whole = memo.get(key)
    if whole is None:
        flat = tensor.as_strided((nbytes // itemsize,), (1,), 0)
        whole = memo[key] = flat.view(torch.uint8).clone()
    view = whole.view(tensor.dtype).as_strided(
        tensor.size(), tensor.stride(), tensor.storage_offset()
    )
    return view.detach()  # shares the copied storage, without a _base (as set_ would)


def shallow_copy_deferred(tensor: DeferredTensor) -> torch.Tensor:
    """``copy.copy``: a new tensor object over the same storage, same attributes."""

    new = tensor.detach()
    new.requires_grad_(tensor.requires_grad)
    user = user_class(tensor)
    if issubclass(user, nn.Parameter):
        # Eager rebuilds any Parameter subclass as nn.Parameter (_rebuild_parameter).
        new.__class__ = deferred_class(nn.Parameter)
    elif type(tensor) is not DeferredTensor:
        new.__class__ = type(tensor)
    new.__dict__.update(user_attributes(tensor))
    return new
