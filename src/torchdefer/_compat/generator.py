"""Every read of a ``torch.Generator``'s state, seen while a recording runs.

While ``deferred_init`` records, a CPU generator may hold a *marker* state
(``rng.ledger``: cheap to set, unlike the exact state, which costs a
jump-ahead). A marker must never reach user code: restored after the block,
it would draw numbers no eager program draws. ``torch.get_rng_state`` is a
Python function, but ``Generator.get_state`` and its neighbours are methods of
a C type whose type is immutable (``setattr`` refuses). So the methods that
hand out a state are replaced in the type's own dict (forbiddenfruit-style:
the dict behind ``Generator.__dict__``, then ``PyType_Modified`` to drop
CPython's method caches and specializations) by wrappers that first ask the
caller's recording to put the exact state in the generator
(:func:`intercept_reads`), and put back when the last recording ends
(:func:`restore_reads`). Only while a recording runs: no import-time patching.

Read paths covered: ``get_state`` (``torch.get_rng_state``,
``torch.random.fork_rng``, ``torch.cuda.get_rng_state(_all)`` and any library
go through it), ``clone_state``, ``graphsafe_get_state`` and ``__reduce__``
(``pickle``, ``copy.copy``). ``copy.deepcopy`` gets a ``__deepcopy__`` for the
time (the type has none): eager's deep copy copies the state tensor through
``Tensor.__deepcopy__``, which a recording would record as a deferred tensor;
the copy made here is eager's, a new generator set to the (exact) state. Not
covered: a bound method or method descriptor taken *before* the recording
began (``get = g.get_state``), which calls the C function directly.

Checked on the running interpreter and torch the first time (the wrapper
must be what attribute lookup finds, and a call must reach it; CPython
3.10-3.13 and torch 2.8-2.15 pass). Where the check fails, :func:`intercept_reads`
returns False and the recorder never leaves a marker (every random op puts
the exact state in the generator at once: slower, never wrong).

Internal code that saves and restores a generator around its own work (and
must see a marker as it is) reads with :data:`get_state`, the original method.
"""

from __future__ import annotations

import ctypes
import functools
import gc
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["STATE_READS", "get_state", "intercept_reads", "reads_intercepted", "restore_reads"]

_TYPE = torch._C.Generator
STATE_READS = tuple(
    name for name in ("get_state", "clone_state", "graphsafe_get_state", "__reduce__")
    if name in _TYPE.__dict__
)
"""The methods of ``torch.Generator`` that hand out its state (those this torch has)."""

_ORIGINAL = {name: _TYPE.__dict__[name] for name in STATE_READS}
get_state: Callable[[torch.Generator], torch.Tensor] = _ORIGINAL["get_state"]
"""``Generator.get_state`` itself, never intercepted: ``get_state(generator)``."""

_installed: list[Callable[[Any], None]] = []  # the hook while the wrappers are in


def _type_dict() -> dict[str, Any] | None:
    """The dict behind ``torch._C.Generator.__dict__`` (a mappingproxy of it)."""
    found = [d for d in gc.get_referents(_TYPE.__dict__) if isinstance(d, dict)]
    return found[0] if len(found) == 1 and "get_state" in found[0] else None


def _modified() -> None:
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(_TYPE))


def _wrapper(name: str) -> Callable[..., Any]:
    original = _ORIGINAL[name]

    def read(self: torch.Generator, *args: Any, **kwargs: Any) -> Any:
        if _installed:
            _installed[0](self)
        return original(self, *args, **kwargs)

    read.__name__ = read.__qualname__ = name
    read.__doc__ = original.__doc__
    return read


def _deepcopy(self: torch.Generator, memo: dict) -> torch.Generator:
    """What ``copy.deepcopy`` gives in eager code: a new generator with the state."""
    cls, args, state = self.__reduce__()  # the wrapper: an exact state
    copied = cls(*args)
    copied.__setstate__(state)
    return copied


_WRAPPERS = {name: _wrapper(name) for name in STATE_READS}
if "__deepcopy__" not in _TYPE.__dict__ and "__reduce__" in _WRAPPERS:
    _WRAPPERS["__deepcopy__"] = _deepcopy


def _put(methods: dict[str, Any]) -> bool:
    type_dict = _type_dict()
    if type_dict is None:
        return False
    type_dict.update(methods)
    for name in _WRAPPERS.keys() - methods.keys():  # added for the time only
        type_dict.pop(name, None)
    _modified()
    return True


def intercept_reads(before: Callable[[torch.Generator], None]) -> bool:
    """Call ``before(generator)`` ahead of every state read until :func:`restore_reads`.

    Returns False (and changes nothing) where this interpreter does not allow
    it; the caller must then never leave a state user code must not see.
    """
    if not reads_intercepted():
        return False
    _installed[:] = [before]
    return _put(_WRAPPERS)


def restore_reads() -> None:
    """Put the original methods back (a no-op if :func:`intercept_reads` did nothing)."""
    if _installed:
        _installed.clear()
        _put(_ORIGINAL)


@functools.cache
def reads_intercepted() -> bool:
    """Whether the wrappers can be installed here (tried once, then cached)."""
    seen: list[Any] = []
    _installed[:] = [seen.append]
    try:
        if not _put(_WRAPPERS):
            return False
        probe = torch.Generator()
        probe.get_state()
        torch.get_rng_state()
        works = all(getattr(_TYPE, name) is method for name, method in _WRAPPERS.items())
        works = works and len(seen) == 2 and seen[0] is probe
    except Exception:  # any failure means: do not rely on it
        works = False
    finally:
        _installed.clear()
        _put(_ORIGINAL)
    return works and all(_TYPE.__dict__.get(name) is _ORIGINAL.get(name) for name in _WRAPPERS)
