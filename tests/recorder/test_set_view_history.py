"""``Tensor.set_`` of a view whose autograd history cannot be rebuilt on fake tensors.

``set_``'s binding takes no ``__torch_function__``, so autograd's failure to
rebuild the source view's ``grad_fn`` (it replays the view's ops where eager
uses ``as_strided``) escaped as PyTorch's "new_fn INTERNAL ASSERT FAILED"
(fuzz seed 20261202). It is refused as every other op on such a view is,
naming ``set_`` and the user's line, also after the recording returned (the
wrapper, installed at the first recording, stays: the deferred tensors do).
"""

import re

import pytest
import torch

import torchdefer
from torchdefer.fake._tensor import FakeTensorError


def _stale_view_then(use):
    t1 = torch.arange(16.0).sin().reshape((4, 4))
    t1.requires_grad_()
    t3 = t1.as_strided((2,), (2,), 1)
    with torch.no_grad():
        t3[1:].add_(1)
    return use(t3)


def test_set_to_such_a_view_is_refused_with_the_users_line():
    _stale_view_then(lambda v: torch.empty(0).set_(v))  # eager works
    with pytest.raises(FakeTensorError) as caught:
        torchdefer.deferred_init(_stale_view_then, lambda v: torch.empty(0).set_(v))
    message = str(caught.value)
    assert message.startswith("set_ at ") and "cannot rebuild the history" in message, message
    assert re.search(r"test_set_view_history.py:\d+", message), message


def test_set_to_such_a_deferred_view_after_the_recording_is_refused_not_an_assert():
    view = torchdefer.deferred_init(_stale_view_then, lambda v: v)
    with pytest.raises(FakeTensorError, match="cannot rebuild the history"):
        torch.empty(0).set_(view)


def test_the_wrapper_leaves_real_tensors_set_as_eager():
    a = torch.arange(6.0).reshape(2, 3)
    b = torch.empty(0).set_(a.t())
    assert b.data_ptr() == a.data_ptr() and b.stride() == (1, 3)
    with pytest.raises(RuntimeError, match="same device|different device|storage"):
        torch.empty(0, device="meta").set_(a)


def test_set_of_ordinary_tensors_still_records_and_replays():
    def build():
        a = torch.arange(6.0).reshape(2, 3)
        return torch.empty(0).set_(a.t()), a

    eager = build()
    out, base = torchdefer.deferred_init(build)
    real = torchdefer.materialize_tensor(out)
    assert torch.equal(real, eager[0]) and real.stride() == eager[0].stride()
