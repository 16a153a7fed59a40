"""Run plain torch code while a fake or recording mode is active.

The bottom of ``fake/``: the modules that ask eager a question (``_grad``,
``_pinned``) and the modes themselves use it, and it imports none of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torchdefer import _compat

__all__ = ["no_fake_modes"]


@contextlib.contextmanager
def no_fake_modes() -> Iterator[None]:
    """Run plain torch code while a fake or recording mode is active.

    ``torch.utils._python_dispatch._disable_current_modes`` leaves PyTorch's FAKE
    mode slot alone, so the mode there is taken out and put back here.
    """

    if not _compat.dispatch_modes_active():  # nothing to take out: skip torch's ~15 us
        yield
        return
    mode = _compat.unset_dispatch_mode(_compat.FAKE_MODE_KEY)
    try:
        with _compat.disable_current_modes():
            yield
    finally:
        if mode is not None:
            _compat.set_dispatch_mode(mode)
