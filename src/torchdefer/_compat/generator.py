"""Every read of a ``torch.Generator``'s state, seen while a recording runs.

While ``deferred_init`` records, a CPU generator may hold a *marker* state
(``rng._ledger``: cheap to set, unlike the exact state, which costs a
jump-ahead). A marker must never reach user code: restored after the block,
it would draw numbers no eager program draws. ``torch.get_rng_state`` is a
Python function, but ``Generator.get_state`` and its neighbours are methods of
a C type, and a bound method taken before the recording began
(``get = g.get_state``, ``functools.partial(g.get_state)``) calls the C
function directly. So while a recording runs, each method that hands out a
state has its C method table entry redirected (``_compat.method_table``) to
a wrapper that first asks the caller's recording to put the exact state in
the generator (:func:`intercept_reads`), and gets it back when the last
recording ends (:func:`restore_reads`). Only while a recording runs: no
import-time patching.

Read paths covered: ``get_state`` (``torch.get_rng_state``,
``torch.random.fork_rng``, ``torch.cuda.get_rng_state(_all)`` and any library
go through it), ``clone_state``, ``graphsafe_get_state`` and ``__reduce__``
(``pickle``, ``copy.copy``), however and whenever they were looked up.
``copy.deepcopy`` gets a ``__deepcopy__`` for the time (the type has none):
eager's deep copy copies the state tensor through ``Tensor.__deepcopy__``,
which a recording would record as a deferred tensor; the copy made here is
eager's, a new generator set to the (exact) state.

Checked on the running interpreter and torch the first time (every read
path, a bound method taken before, must reach the wrapper and give the
original's result, and everything must be put back; CPython 3.11 and torch
2.8-2.15 pass). Where the check fails, :func:`intercept_reads` returns False
and the recorder never leaves a marker (every random op puts the exact state
in the generator at once: slower, never wrong).

Internal code that saves and restores a generator around its own work (and
must see a marker as it is) reads with :func:`get_state`, never redirected.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from torchdefer._compat import method_table
from torchdefer.errors import UnsupportedError

__all__ = [
    "STATE_READS",
    "generator_id",
    "get_state",
    "intercept_reads",
    "reads_intercepted",
    "restore_reads",
]

_TYPE = torch._C.Generator


def generator_id(generator: torch.Generator) -> int:
    """The address of the C++ generator behind a ``torch.Generator`` wrapper.

    The dispatcher hands ops a new Python wrapper of the generator the user
    passed, so wrappers of one generator differ; this (``_cdata``) does not.
    """
    address: int = generator._cdata  # type: ignore[attr-defined]  # private, not in the stubs
    return address

STATE_READS = tuple(
    name for name in ("get_state", "clone_state", "graphsafe_get_state", "__reduce__")
    if name in _TYPE.__dict__
)
"""The methods of ``torch.Generator`` that hand out its state (those this torch has)."""

# The original methods, never redirected: the descriptors until the check
# below passes, then the table entries' copies.
_direct: dict[str, Callable[[Any], Any]] = {name: _TYPE.__dict__[name] for name in STATE_READS}
_redirects: dict[str, method_table.Redirect] = {}
_installed: list[Callable[[Any], None]] = []  # the hook while the redirects are in


def get_state(generator: torch.Generator) -> torch.Tensor:
    """``Generator.get_state`` itself, never intercepted: ``get_state(generator)``."""
    return _direct["get_state"](generator)


def _wrapper(name: str) -> Callable[[torch.Generator], Any]:
    def read(self: torch.Generator) -> Any:
        if _installed:
            _installed[0](self)
        return _direct[name](self)

    read.__name__ = read.__qualname__ = name
    return read


def _deepcopy(self: torch.Generator, memo: dict) -> torch.Generator:
    """What ``copy.deepcopy`` gives in eager code: a new generator with the state."""
    cls, args, state = self.__reduce__()  # redirected: an exact state
    copied = cls(*args)
    copied.__setstate__(state)
    return copied


def _put(hook: Callable[[Any], None] | None) -> None:
    type_dict = method_table.type_dict(_TYPE)
    if type_dict is None:
        raise UnsupportedError("torch.Generator's type dict is not found in this interpreter's "
                               "memory layout; generator reads cannot be intercepted here")
    if hook is None:
        _installed.clear()
        for redirect in _redirects.values():
            redirect.remove(type_dict)
        type_dict.pop("__deepcopy__", None)
        method_table.type_modified(_TYPE)
        return
    _installed[:] = [hook]
    if "__deepcopy__" not in _TYPE.__dict__ and "__reduce__" in _redirects:
        type_dict["__deepcopy__"] = _deepcopy
    for name, redirect in _redirects.items():
        redirect.install(_wrapper(name), type_dict)


def intercept_reads(before: Callable[[torch.Generator], None]) -> bool:
    """Call ``before(generator)`` ahead of every state read until :func:`restore_reads`.

    Returns False (and changes nothing) where this interpreter does not allow
    it; the caller must then never leave a state user code must not see.
    """
    if not reads_intercepted():
        return False
    _put(before)
    return True


def restore_reads() -> None:
    """Put the original methods back (a no-op if :func:`intercept_reads` did nothing)."""
    if _installed:
        _put(None)


@functools.cache
def reads_intercepted() -> bool:
    """Whether every read can be intercepted here (tried once, then cached)."""
    if "__deepcopy__" in _TYPE.__dict__ or "get_state" not in STATE_READS:
        return False
    try:
        redirects = {name: method_table.Redirect(_TYPE, name, dunder)
                     for name, dunder in zip(STATE_READS, method_table.SLOT_DUNDERS)}
    except (RuntimeError, KeyError, ValueError, OSError):
        return False
    _direct.update({name: r.original for name, r in redirects.items()})
    _redirects.update(redirects)
    works = False
    try:
        works = _round_trip()
    except Exception:  # any failure means: do not rely on it
        works = False
    finally:
        _put(None)
    clean = not any(r.installed() for r in redirects.values()) and all(
        name not in _TYPE.__dict__ for name in (*method_table.SLOT_DUNDERS, "__deepcopy__"))
    if not (works and clean):
        _redirects.clear()
        _direct.update({name: _TYPE.__dict__[name] for name in STATE_READS})
    return works and clean


class _Refused(Exception):
    pass


def _round_trip() -> bool:
    """Every read path reaches the hook, gives the original's result, and raises its errors."""
    probe = torch.Generator().manual_seed(5)
    bound = probe.get_state  # taken before: the case a dict entry cannot reach
    expected = _direct["get_state"](probe)
    seen: list[Any] = []
    _put(seen.append)
    reads = [bound(), _TYPE.get_state(probe), probe.get_state(), probe.__reduce__()[2][-1]]
    if "clone_state" in _redirects:
        reads.append(_direct["get_state"](probe.clone_state()))
    torch.get_rng_state()
    same = all(torch.equal(state, expected) for state in reads)
    counted = len(seen) == len(reads) + 1 and all(g is probe for g in seen[:-1])
    counted = counted and seen[-1] is torch.default_generator

    def refuse(generator: Any) -> None:
        raise _Refused

    _put(refuse)
    try:
        bound()
        return False
    except _Refused:
        return same and counted
