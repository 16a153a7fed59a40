"""The one way torchdefer changes global state for a while: :func:`patched`.

A recording replaces a few bindings of torch and Python while it runs
(``torch.Tensor._make_subclass``, ``threading.Thread.start``, the data-reading
``nn.init`` functions, FSDP1's materialization check ...) and a few settings
(the default dtype). Every one of them goes through :func:`patched`, which
puts back exactly what it found, also when the block raises:

* an attribute the owner did not have in its own ``__dict__`` (inherited from
  a base class, such as ``torch.Tensor.data`` from ``TensorBase``) is deleted
  again, not copied down onto the owner;
* an attribute or setting that already holds what was found is not written;
* ``restore_if`` lets a caller leave a value someone else set meanwhile (the
  default dtype set by another thread while this one recorded).

Patches that stay while *any* thread is inside a block, and go when the last
one leaves, are a :class:`SharedPatches`.

>>> import torch
>>> from torchdefer._compat.patch import patched, setting
>>> with patched(setting(torch.get_default_dtype, torch.set_default_dtype), torch.float64):
...     torch.get_default_dtype()
torch.float64
>>> torch.get_default_dtype()
torch.float32
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["KEEP", "MISSING", "Attribute", "PatchStack", "Setting", "SharedPatches", "attribute",
           "patched", "setting"]


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()  # an attribute absent from its owner's own __dict__
KEEP: Any = object()  # patched(slot, KEEP): write nothing now, restore on exit


class Attribute:
    """An attribute of a class or module, as a slot :func:`patched` can save and restore."""

    __slots__ = ("_own", "name", "owner")

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name
        self._own = vars(owner)  # a live view: a class's mappingproxy, a module's dict

    def read(self) -> Any:
        # The owner's own binding: one it inherits is restored by deleting ours.
        return self._own.get(self.name, MISSING)

    def write(self, value: Any) -> None:
        if value is MISSING:
            if self.name in self._own:
                delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, value)

    def same(self, a: Any, b: Any) -> bool:
        return a is b


class Setting:
    """A global setting read and written through torch's getter and setter."""

    __slots__ = ("get", "set")

    def __init__(self, get: Callable[[], Any], set: Callable[[Any], Any]) -> None:
        self.get, self.set = get, set

    def read(self) -> Any:
        return self.get()

    def write(self, value: Any) -> None:
        self.set(value)

    def same(self, a: Any, b: Any) -> bool:
        return bool(a == b)


def attribute(owner: Any, name: str) -> Attribute:
    """``owner.name`` (a class or module attribute) as a slot."""
    return Attribute(owner, name)


def setting(get: Callable[[], Any], set: Callable[[Any], Any]) -> Setting:
    """A setting read by ``get()`` and written by ``set(value)`` as a slot."""
    return Setting(get, set)


class patched:  # lower case: used as a function, like contextlib.suppress
    """``value`` in ``slot`` for the block; what was there before, put back after it.

    Args:
        slot: :func:`attribute` or :func:`setting`.
        value: what the block runs with; ``KEEP`` writes nothing (the block
            itself may change the slot, and what it found is put back).
        restore_if: called at exit with what the slot holds then; False
            leaves it (a change the block does not own). None: always restore.

    ``with`` gives what the slot held before (``MISSING`` for an attribute
    the owner did not have itself). A class, not a generator: a recording
    enters several of these, and ``deferred_init`` of a small module is
    ~0.3 ms in all.
    """

    __slots__ = ("_before", "_new", "_restore_if", "_slot")

    def __init__(self, slot: Attribute | Setting, value: Any = KEEP, *,
                 restore_if: Callable[[Any], bool] | None = None) -> None:
        self._slot, self._new, self._restore_if = slot, value, restore_if

    def __enter__(self) -> Any:
        slot, value = self._slot, self._new
        self._before = before = slot.read()
        if value is not KEEP and not slot.same(before, value):
            slot.write(value)
        return before

    def __exit__(self, *exc: object) -> None:
        self.exit()

    def exit(self) -> None:
        """Put back what ``__enter__`` found (as leaving the ``with`` block does)."""
        slot, before, restore_if = self._slot, self._before, self._restore_if
        now = slot.read()
        if not slot.same(now, before) and (restore_if is None or restore_if(now)):
            slot.write(before)


class PatchStack:
    """The patches one install entered, undone together in reverse order.

    A small ``contextlib.ExitStack`` (entering and closing one of those is
    several microseconds per patch, paid by every ``deferred_init``).
    """

    __slots__ = ("_undo",)

    def __init__(self) -> None:
        self._undo: list[Callable[[], object]] = []

    def enter(self, patch: patched) -> Any:
        """Enter ``patch``; closing the stack exits it."""
        before = patch.__enter__()
        self._undo.append(patch.exit)
        return before

    def callback(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` when the stack closes (in reverse order with the patches)."""
        self._undo.append(fn)

    def close(self) -> None:
        """Undo everything, last in first out; the first error is raised after all ran."""
        error: BaseException | None = None
        while self._undo:
            try:
                self._undo.pop()()
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error


class SharedPatches:
    """Patches held while any thread is inside :meth:`held`; the last one out removes them.

    ``install(stack)`` enters the :class:`patched` blocks on ``stack`` (a
    :class:`PatchStack`) when the first thread enters; closing the stack when
    the last one leaves restores them in reverse order. Patching per block
    would let two threads' blocks, ending in another order than they began,
    leave a patch behind.
    """

    def __init__(self, install: Callable[[PatchStack], None]) -> None:
        self._install = install
        self._lock = threading.Lock()
        self._depth = 0
        self._stack: PatchStack | None = None

    @property
    def active(self) -> bool:
        """Whether the patches are in."""
        return self._stack is not None

    def enter(self) -> None:
        """One more block inside (installs the patches for the first)."""
        with self._lock:
            if self._depth == 0:
                stack = PatchStack()
                try:
                    self._install(stack)
                except BaseException:
                    stack.close()  # what was installed before the failure
                    raise
                self._stack = stack
            self._depth += 1

    def leave(self) -> None:
        """One block fewer (the last one out removes the patches)."""
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._stack is not None:
                stack, self._stack = self._stack, None
                stack.close()

    def held(self) -> SharedPatches:
        """``with patches.held():`` holds them for the block (``enter``/``leave``)."""
        return self

    def __enter__(self) -> None:
        self.enter()

    def __exit__(self, *exc: object) -> None:
        self.leave()
