"""Route every call of a C type's no-argument method through Python, bound methods included.

Replacing a method in a C type's dict is seen by attribute lookups made
*after* the replacement, but not by a bound method or method descriptor taken
before it (``get = generator.get_state``): those hold a pointer to the C
method table entry (``PyMethodDef``) and call its function pointer
``ml_meth`` directly. This module redirects that pointer instead, so every
caller, whenever it looked the method up, reaches Python code.

The pointer is set to one of CPython's own unary slot functions
(``slot_nb_negative`` and its siblings: they look ``__neg__`` up on the
object's type and call it, propagating exceptions), read from a heap class
that defines the dunder; the dunder is put in the type's dict for the
time. A ``METH_NOARGS`` function is called as ``f(self, NULL)``, and a unary
slot function ``f(self)`` ignores the second argument (the C calling
conventions of every platform CPython supports pass it in a register or
leave it on the caller's stack). The original function stays callable
through a copy of the table entry (:attr:`Redirect.original`).

Layout assumptions (CPython 3.8 to 3.13+, 64-bit, GIL build, no
``Py_TRACE_REFS``): a method descriptor's ``d_method`` follows five pointers;
``ml_meth`` is ``PyMethodDef``'s second field; ``tp_as_number`` is the
type's thirteenth pointer-sized field. :func:`usable` checks the build and
:class:`Redirect` checks the entry it reads (its name, ``METH_NOARGS``, a
writable page) before writing anything; ``_compat.generator`` then checks the
whole round trip once per process and never relies on a redirect that
failed it.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import sysconfig
from collections.abc import Callable
from typing import Any

from torchdefer.errors import UnsupportedError

__all__ = ["SLOT_DUNDERS", "Redirect", "type_dict", "type_modified", "usable"]

_P = ctypes.sizeof(ctypes.c_void_p)
_D_METHOD = 5 * _P  # PyObject_HEAD (2) + d_type, d_name, d_qualname
_ML_METH = _P
_ML_FLAGS = 2 * _P
_METH_NOARGS = 0x0004
_TP_AS_NUMBER = 12 * _P
# The unary PyNumberMethods slots whose slot function is a plain "look the
# dunder up on the type, call it with self" (CPython's SLOT0), by field index.
_NB_INDEX = {"__neg__": 6, "__pos__": 7, "__abs__": 8, "__invert__": 10}
SLOT_DUNDERS = tuple(_NB_INDEX)
"""The dunders a redirect may use, one per redirected method at a time."""


def usable() -> bool:
    """Whether this interpreter has the layout this module reads."""
    return (
        sys.implementation.name == "cpython"
        and _P == 8
        and not sysconfig.get_config_var("Py_GIL_DISABLED")
        and not hasattr(sys, "getobjects")  # a Py_TRACE_REFS build: two more header fields
    )


def type_dict(cls: type) -> dict[str, Any] | None:
    """The dict behind a C type's read-only ``__dict__`` proxy (None if not found)."""
    found = [d for d in gc.get_referents(cls.__dict__) if isinstance(d, dict)]
    return found[0] if len(found) == 1 and found[0].keys() == cls.__dict__.keys() else None


def type_modified(cls: type) -> None:
    """Drop CPython's caches of ``cls``'s attributes (after its dict changed)."""
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(cls))


def _pointer(address: int) -> int:
    return ctypes.c_void_p.from_address(address).value or 0


def _slot_function(dunder: str) -> int:
    """The address of CPython's slot function for ``dunder``, read from a heap class."""
    probe = type("_SlotProbe", (), {dunder: lambda self: None})
    plain = type("_PlainProbe", (), {})
    field = _NB_INDEX[dunder] * _P
    found = _pointer(_pointer(id(probe) + _TP_AS_NUMBER) + field)
    absent = _pointer(_pointer(id(plain) + _TP_AS_NUMBER) + field)
    if not found or absent:
        raise UnsupportedError(f"no slot function found for {dunder}")
    return found


def _writable(address: int) -> bool:
    """Whether ``address`` lies in a writable mapping of this process (Linux only)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                span, perms = line.split()[:2]
                low, high = (int(x, 16) for x in span.split("-"))
                if low <= address < high:
                    return perms[1] == "w"
    except OSError:
        pass
    return False


_new_descriptor = ctypes.pythonapi.PyDescr_NewMethod
_new_descriptor.restype = ctypes.py_object
_new_descriptor.argtypes = [ctypes.py_object, ctypes.c_void_p]


class Redirect:
    """One ``METH_NOARGS`` method of a C type, redirectable to a Python function.

    ``Redirect(cls, name, dunder)`` checks the table entry and keeps a copy of
    it; :meth:`install` ``(function)`` makes every call of ``cls.name`` (bound
    before or after) call ``function(self)`` instead, :meth:`remove` undoes
    it. Raises :class:`~torchdefer.errors.UnsupportedError` (a ``RuntimeError``)
    where the entry is not what this module expects (then nothing was written).
    """

    def __init__(self, cls: type, name: str, dunder: str) -> None:
        if not usable():
            raise UnsupportedError("this interpreter's layout is not the one this module reads")
        self.cls, self.name, self.dunder = cls, name, dunder
        descriptor = cls.__dict__.get(name)
        if type(descriptor).__name__ != "method_descriptor":
            raise UnsupportedError(f"{cls.__name__}.{name} is not a C method")
        entry = _pointer(id(descriptor) + _D_METHOD)
        if not entry or ctypes.c_char_p.from_address(entry).value != name.encode():
            raise UnsupportedError(f"{cls.__name__}.{name}: the method table entry is not found")
        if ctypes.c_int.from_address(entry + _ML_FLAGS).value != _METH_NOARGS:
            raise UnsupportedError(f"{cls.__name__}.{name} is not a METH_NOARGS method")
        if not _writable(entry + _ML_METH):
            raise UnsupportedError(f"{cls.__name__}.{name}: the method table is read-only")
        self._entry = entry
        self._meth = _pointer(entry + _ML_METH)
        self._slot = _slot_function(dunder)
        # A copy of the entry, kept alive with the descriptor made from it.
        self._copy = ctypes.create_string_buffer(ctypes.string_at(entry, 4 * _P), 4 * _P)
        self.original: Callable[[Any], Any] = _new_descriptor(cls, ctypes.addressof(self._copy))
        """The original C method, never redirected: ``original(self)``."""

    def install(self, function: Callable[[Any], Any], cls_dict: dict[str, Any]) -> None:
        """Make every call of the method call ``function(self)``.

        ``cls_dict``: the type's dict, from :func:`type_dict`.
        """
        cls_dict[self.dunder] = function
        type_modified(self.cls)
        ctypes.c_void_p.from_address(self._entry + _ML_METH).value = self._slot

    def remove(self, cls_dict: dict[str, Any]) -> None:
        """Put the original function pointer back, then drop the dunder."""
        ctypes.c_void_p.from_address(self._entry + _ML_METH).value = self._meth
        cls_dict.pop(self.dunder, None)
        type_modified(self.cls)

    def installed(self) -> bool:
        return _pointer(self._entry + _ML_METH) == self._slot
