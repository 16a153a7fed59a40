"""Deferred stand-ins for tensor subclasses: ``nn.Parameter``, its subclasses, lazy tensors.

Code written for eager tensors relies on a parameter's *class*:
``isinstance(p, nn.Parameter)``, ``type(p)(data, requires_grad=...)``
(accelerate, Hugging Face loading), a quantization library's
``class Int8Params(nn.Parameter)`` with its own ``__new__`` and attributes,
``nn.UninitializedParameter`` in lazy modules. A deferred tensor must be a
:class:`DeferredTensor` (its dispatch records every op), so each user class
``C`` gets one *deferred class* with bases ``(DeferredTensor, C)``:
``DeferredTensor`` first, so that recording wins over ``C``'s own
``__torch_function__``; ``C``'s methods and attributes otherwise.
Materialization gives the real tensor class ``C`` back (:func:`user_class`).

How deferred objects get their class:

* ``nn.Parameter(deferred)`` takes Parameter's path for tensor subclasses
  (``data.detach()``, then ``t._is_param = True``); DeferredTensor's
  ``_is_param`` setter reads the class being built from that call
  (:func:`parameter_class_being_built`).
* ``torch.Tensor._make_subclass(C, deferred)`` (what ``Parameter`` subclasses'
  and lazy tensors' ``__new__`` call) cannot work on a tensor that already has
  a Python object, so :func:`subclassing` routes it here while it is active:
  inside ``deferred_init``, ``type(p)(...)`` and ``copy.deepcopy``.

Not covered: ``C(deferred)`` *after* ``deferred_init`` for a class whose
``__new__`` calls ``_make_subclass`` raises PyTorch's own error ("Creating a
new Tensor subclass C but the raw Tensor object is already associated...");
build such parameters inside ``deferred_init``. A class's own
``__torch_function__`` is not called on its deferred objects (recording takes
that place); the values it computes are those of the plain ops.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]  # not in parameter.pyi

from torchdefer import _compat
from torchdefer._compat.patch import SharedPatches, attribute, patched
from torchdefer.errors import RecordingError
from torchdefer.fake._calls import call_grad_safe
from torchdefer.fake._mode import import_dynamo_outside_modes
from torchdefer.fake._source import is_library_code
from torchdefer.recorder._mode import recording
from torchdefer.recorder._tensor import PRIVATE_ATTRIBUTES, DeferredTensor

__all__ = [
    "deferred_class",
    "detach_for_parameter",
    "make_parameter",
    "subclassing",
    "user_class",
]

_classes: dict[type, type] = {torch.Tensor: DeferredTensor}
# DeferredTensor answers these itself (before __torch_function__); a user class
# that defines its own keeps them in its deferred class.
_OWN_ANSWERS = ("detach", "grad_fn", "requires_grad_")
_original_make_subclass = _compat.TensorBase._make_subclass


def user_class(tensor: DeferredTensor) -> type:
    """The class the real tensor gets: ``C`` for ``Deferred[C]``, ``torch.Tensor`` for plain."""
    return getattr(type(tensor), "_torchdefer_user_class", torch.Tensor)


def deferred_class(user: type[torch.Tensor]) -> type:
    """The deferred class standing for tensor class ``user`` (made once per class)."""
    cls = _classes.get(user)
    if cls is None:
        if user.__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
            raise RecordingError(
                f"{user.__qualname__} is a tensor subclass with its own __torch_dispatch__; "
                "a deferred tensor cannot become one (its data layout is its own). Create "
                f"the {user.__name__} from the real tensor after materialization."
            )
        namespace: dict[str, Any] = {
            "__module__": __name__,
            "__qualname__": user.__qualname__,
            "__new__": _new,
            "_torchdefer_user_class": user,
        }
        if issubclass(user, UninitializedTensorMixin):
            namespace.update(_lazy_namespace(user))
        for name in _OWN_ANSWERS:  # the user's class's own, over DeferredTensor's shortcuts
            own = inspect.getattr_static(user, name)
            if own is not inspect.getattr_static(torch.Tensor, name):
                namespace[name] = own
        try:
            cls = type(user.__name__, (DeferredTensor, user), namespace)
        except TypeError as e:
            raise RecordingError(
                f"Cannot make a deferred {user.__qualname__}: {e}. Create it from the real "
                "tensor after materialization."
            ) from e
        _classes[user] = cls
    return cls


def _new(cls: type, *args: Any, **kwargs: Any) -> Any:
    """``type(p)(data, requires_grad=...)`` on a deferred ``p``: what ``C(...)`` gives.

    Real ``data`` gives a real ``C``; deferred ``data`` gives a deferred ``C``.
    """
    user = cls._torchdefer_user_class  # type: ignore[attr-defined]
    # Code that rebuilds a parameter as ``type(p)(data, **p.__dict__)``
    # (accelerate's init_empty_weights, bitsandbytes) passes torchdefer's own
    # fields back as constructor arguments; they describe the old object, not
    # arguments of the user's class.
    kwargs = {k: v for k, v in kwargs.items() if k not in PRIVATE_ATTRIBUTES}
    with subclassing(), _recording_for(args, kwargs):
        obj = user.__new__(user, *args, **kwargs)
    if isinstance(obj, DeferredTensor) and not isinstance(obj, cls):
        obj.__class__ = cls  # Parameter.__new__'s path for tensor subclasses ignores cls
    elif not isinstance(obj, cls) and isinstance(obj, user):
        obj.__init__(*args, **kwargs)  # type.__call__ only initializes instances of cls
    return obj


def _recording_for(args: tuple, kwargs: dict) -> contextlib.AbstractContextManager[None]:
    for a in (*args, *kwargs.values()):
        if isinstance(a, DeferredTensor):
            return recording(a._graph)
    return contextlib.nullcontext()


def make_parameter(tensor: DeferredTensor) -> None:
    """Give ``tensor`` the deferred class of the Parameter class being built.

    Called by DeferredTensor's ``_is_param`` setter, which Parameter's path for
    tensor subclasses runs as ``t._is_param = True``; the class being built is
    a local of that calling frame (``MyParam(deferred)`` for a subclass without
    its own ``__new__`` must give a deferred ``MyParam``).
    """
    cls = _parameter_class_being_built(sys._getframe(2))
    if cls is not None:
        tensor.__class__ = deferred_class(cls)
    elif type(tensor) is DeferredTensor:
        tensor.__class__ = deferred_class(nn.Parameter)


def detach_for_parameter(tensor: DeferredTensor) -> torch.Tensor:
    """``tensor.detach()`` for a deferred tensor of a subclass.

    Eager ``detach()`` of a Parameter gives a plain tensor, and so does this,
    except inside ``nn.Parameter.__new__``: there ``nn.Parameter(p)`` of an
    eager Parameter ``p`` makes a new Parameter, while its path for tensor
    subclasses wants ``detach()`` to keep the class of ``p``.
    """
    with recording(tensor._graph), _compat.DisableTorchFunctionSubclass():
        out = call_grad_safe(torch.Tensor.detach, (tensor,), {})
    if user_class(tensor) is nn.Parameter and _parameter_class_being_built(sys._getframe(2)):
        out.__class__ = type(tensor)
    return out


def _parameter_class_being_built(frame: Any) -> type | None:
    # Torch function modes (`with torch.device(...)`, set_default_device) put
    # their own frames between Parameter.__new__ and here: look past library
    # frames, never past the user's.
    while frame is not None:
        if frame.f_code is nn.Parameter.__new__.__code__:
            cls = frame.f_locals.get("cls")
            return cls if isinstance(cls, type) and issubclass(cls, nn.Parameter) else None
        if not is_library_code(frame.f_code):
            return None
        frame = frame.f_back
    return None


def _make_subclass(cls: type, data: Any, requires_grad: bool = False, **kwargs: Any) -> Any:
    """``torch.Tensor._make_subclass`` that also accepts a deferred ``data``."""
    if not isinstance(data, DeferredTensor) or kwargs:
        return _original_make_subclass(cls, data, requires_grad, **kwargs)
    out = data.detach()  # recorded, as the C++ version detaches
    out.requires_grad_(requires_grad)
    out.__class__ = deferred_class(cls)
    return out


# Installed while any thread is inside a subclassing() block (threads share it).
_MAKE_SUBCLASS = attribute(torch.Tensor, "_make_subclass")
_PATCH = SharedPatches(lambda stack: stack.enter(
    patched(_MAKE_SUBCLASS, staticmethod(_make_subclass))))


@contextlib.contextmanager
def subclassing() -> Iterator[None]:
    """While active, ``torch.Tensor._make_subclass(C, deferred)`` gives a deferred ``C``.

    The binding is replaced on ``torch.Tensor`` (the C version stays on
    ``torch._C.TensorBase``) and put back when the last block (of any thread) exits;
    other data is passed to the original unchanged.
    """
    # torch._dynamo registers a replacement for torch.Tensor._make_subclass
    # when first imported (which PyTorch does lazily, often while a
    # constructor runs): it must see the original, not the function below.
    import_dynamo_outside_modes()
    with _PATCH.held():
        yield


# ---- lazy modules: UninitializedParameter / UninitializedBuffer --------------------


def _lazy_namespace(user: type) -> dict[str, Any]:
    return {
        # materialize() ends with `self.__class__ = self.cls_to_become`: it must
        # become a deferred Parameter (or plain deferred tensor), not a real class.
        "cls_to_become": deferred_class(user.cls_to_become),  # type: ignore[attr-defined]
        "materialize": _lazy_materialize,
        "__torch_function__": classmethod(_lazy_torch_function),
        "__repr__": UninitializedTensorMixin.__repr__,
    }


def _lazy_materialize(self: Any, shape: Any, device: Any = None, dtype: Any = None) -> None:
    """``UninitializedTensorMixin.materialize``, recorded also after ``deferred_init``."""
    with recording(self._graph):
        UninitializedTensorMixin.materialize(self, shape, device, dtype)


def _lazy_torch_function(cls, func, types, args=(), kwargs=None):
    # As in eager: only the allowed methods work on an uninitialized tensor.
    allowed = UninitializedTensorMixin._allowed_methods
    if func in allowed or func.__class__.__name__ == "method-wrapper":
        return DeferredTensor.__torch_function__.__func__(cls, func, types, args, kwargs)
    raise ValueError(
        f"Attempted to use an uninitialized parameter in {func}. This error happens when "
        "you are using a `LazyModule` or explicitly manipulating "
        f"`torch.nn.parameter.{cls.__name__}` objects. When using LazyModules Call "
        "`forward` with a dummy batch to initialize the parameters before calling torch "
        "functions"
    )
