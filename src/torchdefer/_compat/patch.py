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

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["KEEP", "MISSING", "Attribute", "Setting", "SharedPatches", "attribute", "patched",
           "setting"]


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()  # an attribute absent from its owner's own __dict__
KEEP: Any = object()  # patched(slot, KEEP): write nothing now, restore on exit


class Attribute:
    """An attribute of a class or module, as a slot :func:`patched` can save and restore."""

    __slots__ = ("name", "owner")

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name

    def read(self) -> Any:
        # The owner's own binding: one it inherits is restored by deleting ours.
        return vars(self.owner).get(self.name, MISSING)

    def write(self, value: Any) -> None:
        if value is MISSING:
            if self.name in vars(self.owner):
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


@contextlib.contextmanager
def patched(slot: Attribute | Setting, value: Any = KEEP, *,
            restore_if: Callable[[Any], bool] | None = None) -> Iterator[Any]:
    """``value`` in ``slot`` for the block; what was there before, put back after it.

    Args:
        slot: :func:`attribute` or :func:`setting`.
        value: what the block runs with; ``KEEP`` writes nothing (the block
            itself may change the slot, and what it found is put back).
        restore_if: called at exit with what the slot holds then; False
            leaves it (a change the block does not own). None: always restore.

    Yields:
        What the slot held before (``MISSING`` for an attribute the owner
        did not have itself).
    """
    before = slot.read()
    if value is not KEEP and not slot.same(before, value):
        slot.write(value)
    try:
        yield before
    finally:
        now = slot.read()
        if not slot.same(now, before) and (restore_if is None or restore_if(now)):
            slot.write(before)


class SharedPatches:
    """Patches held while any thread is inside :meth:`held`; the last one out removes them.

    ``install(stack)`` enters the :func:`patched` blocks on ``stack`` (an
    ``ExitStack``) when the first thread enters; closing the stack when the
    last one leaves restores them in reverse order. Patching per block would
    let two threads' blocks, ending in another order than they began, leave a
    patch behind.
    """

    def __init__(self, install: Callable[[contextlib.ExitStack], None]) -> None:
        self._install = install
        self._lock = threading.Lock()
        self._depth = 0
        self._stack: contextlib.ExitStack | None = None

    @property
    def active(self) -> bool:
        """Whether the patches are in."""
        return self._stack is not None

    def enter(self) -> None:
        """One more block inside (installs the patches for the first)."""
        with self._lock:
            if self._depth == 0:
                stack = contextlib.ExitStack()
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

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()
