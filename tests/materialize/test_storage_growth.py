"""A storage grown under live views: every view sees the one grown storage, as in eager.

``resize_``, ``resize_as_``, ``set_`` with a size and an ``out=`` argument grow
a storage in place; eager has one storage object, so views taken before see
the growth and every write to the grown region. Each program here is built
eagerly and deferred from the same seed and materialized in every order (each
tensor first, forward, reverse); the grown regions are always written before
they are read (eager leaves them uninitialized).
"""

import itertools
import warnings

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_tensor, build_both


def transposed_view_written_after_growth():  # issue 24, class 0
    t = torch.zeros(4, 6)
    v = t.transpose(0, 1)
    t.resize_(29)
    t.fill_(0.25)
    v.fill_(1.0)
    return t, v


def random_init_of_a_transposed_view_after_growth():
    t = torch.zeros(4, 6)
    v = t.transpose(0, 1)
    t.resize_(29)
    t.fill_(0.25)
    nn.init.xavier_normal_(v)
    return t, v, v[1:, ::2]


def contiguous_views_after_growth():
    t = torch.zeros(4, 6)
    row, flat = t[0], t.view(-1)
    t.resize_(30)
    t.fill_(0.5)
    row.fill_(2.0)
    flat.mul_(3)
    return t, row, flat


def every_kind_of_view_after_growth():
    t = torch.arange(24.0).reshape(4, 6)
    views = [t.t(), t[:, ::2], t[1:3, 1:4], t.unsqueeze(0).expand(2, 4, 6)[0],
             t.as_strided((3, 3), (1, 6), 2), t.view(torch.int32), t.unflatten(1, (2, 3))]
    t.resize_(41)
    t.fill_(-1.5)
    views[0].normal_()
    views[1].add_(1)
    views[2].zero_()
    views[4].uniform_()
    return [t, *views]


def resize_of_a_non_contiguous_view():
    t = torch.zeros(4, 6)
    v = t.t()
    v.resize_(30)  # contiguous now, over a grown storage
    v.fill_(3.0)
    t.add_(1)
    return t, v


def shrink_then_grow():
    t = torch.arange(24.0).reshape(4, 6)
    v = t.t()
    t.resize_(10)  # keeps the storage
    t.resize_(40)  # grows it; the first 24 elements keep their values
    t[24:] = 7.0
    v.mul_(2)
    return t, v


def resize_as_grows():
    t = torch.ones(3, 5)
    v = t.t()
    t.resize_as_(torch.empty(6, 7))
    t.fill_(0.5)
    v.fill_(4.0)
    return t, v


def set_with_a_size_grows_the_source_storage():
    y = torch.arange(24.0).reshape(4, 6)
    v = y.t()
    x = torch.empty(0).set_(y.untyped_storage(), 0, (40,), (1,))
    x[24:] = 5.0
    v.fill_(1.0)
    return x, y, v


def set_to_a_tensor_with_a_size_grows_its_storage():
    y = torch.arange(24.0).reshape(4, 6)
    v = y.t()
    x = torch.zeros(2)
    x.set_(y, 2, (10, 4), (4, 1))
    x.fill_(-2.0)
    v.add_(1)
    return x, y, v


def growth_through_a_tensor_set_onto_the_storage():
    t = torch.zeros(4, 6)
    v = t.t()
    x = torch.empty(0).set_(t)
    x.resize_(50)  # the storage t shares
    x.fill_(1.5)
    v.fill_(2.5)
    return t, x, v


def set_onto_a_grown_storage():
    t = torch.zeros(4, 6)
    v = t.t()
    t.resize_(36)
    t.fill_(0.75)
    x = torch.empty(0).set_(t.untyped_storage(), 4, (8, 4), (4, 1))
    v.fill_(9.0)
    return t, x, v


def out_argument_resized():
    c = torch.zeros(4, 6)
    w = c.t()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "An output with one or more elements was resized"
        torch.arange(40.0, out=c)
    w.fill_(1.0)
    return c, w


def growth_of_a_parameter_with_views():
    m = nn.Linear(6, 4)
    v = m.weight.t()
    data = m.weight.data  # eager refuses to resize a tensor that requires grad
    data.resize_(30)
    data.fill_(0.1)
    with torch.no_grad():
        nn.init.kaiming_uniform_(v)
    return m.weight, v, data


def set_with_a_size_onto_the_empty_storage_of_set_():
    t = torch.ones(3)
    t.set_()  # a new, empty storage
    t.resize_(6)
    t.fill_(2.0)
    x = torch.zeros(1)
    x.set_(t, 1, (4,), (1,))
    x[3:].fill_(5.0)
    y = torch.zeros(1)
    y.set_(t, 2, (8,), (1,))  # grows t's storage to 10 elements
    y[4:].fill_(7.0)
    return t, x, y


PROGRAMS = [
    transposed_view_written_after_growth, random_init_of_a_transposed_view_after_growth,
    contiguous_views_after_growth, every_kind_of_view_after_growth,
    resize_of_a_non_contiguous_view, shrink_then_grow, resize_as_grows,
    set_with_a_size_grows_the_source_storage, set_to_a_tensor_with_a_size_grows_its_storage,
    growth_through_a_tensor_set_onto_the_storage, set_onto_a_grown_storage,
    out_argument_resized, growth_of_a_parameter_with_views,
    set_with_a_size_onto_the_empty_storage_of_set_,
]


def _orders(n: int):
    yield list(range(n))
    yield list(reversed(range(n)))
    for first in range(1, n):
        yield [first, *(i for i in range(n) if i != first)]


def _storage_of(t):
    return t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_a_grown_storage_is_seen_by_every_view_in_any_order(program):
    n = len(program())
    for order in _orders(n):
        eager, lazy = build_both(program)
        reals = {i: torchdefer.materialize_tensor(lazy[i]) for i in order}
        for i in range(n):
            assert_same_tensor(reals[i], eager[i], f"{program.__name__}[{i}], order {order}")
            assert reals[i].storage_offset() == eager[i].storage_offset()
        for i, j in itertools.combinations(range(n), 2):
            shared = _storage_of(eager[i])[0] == _storage_of(eager[j])[0]
            assert (_storage_of(reals[i])[0] == _storage_of(reals[j])[0]) == shared, (i, j)
            if shared:
                assert _storage_of(reals[i]) [1] == _storage_of(eager[i])[1]


def test_the_fake_storage_reports_the_grown_size():
    def program():
        t = torch.zeros(4, 6)
        v = t.t()
        t.resize_(29)
        return v.untyped_storage().nbytes(), v.untyped_storage().data_ptr() == t.data_ptr()

    eager, lazy = build_both(program)
    assert lazy == eager


def test_growing_a_real_tensor_storage_through_set_is_refused():
    real = torch.arange(6.0)

    def program():
        x = torch.empty(0)
        x.set_(real, 0, (10,), (1,))  # eager grows the real tensor's storage
        return x

    with pytest.raises(torchdefer.TorchdeferError, match="a storage of a real tensor"):
        torchdefer.deferred_init(program)
    assert real.untyped_storage().nbytes() == 24


def test_resizing_a_fake_storage_object_is_refused_with_what_to_do():
    def program():
        t = torch.zeros(4)
        t.untyped_storage().resize_(64)
        return t

    with pytest.raises(torchdefer.TorchdeferError, match=r"t.resize_\(...\)"):
        torchdefer.deferred_init(program)


def test_a_view_of_a_resized_base_that_then_requires_grad_gets_the_view_history_error():
    # Autograd on fake tensors replays the view's ops on the resized base
    # (eager uses as_strided) and fails: the same refusal as after set_.
    def build():
        t = torch.full((1, 5), -1.25, dtype=torch.float16)
        d = t.diagonal()
        t.resize_(10)
        t.fill_(0.1)
        d.fill_(1.5)
        t.requires_grad_()
        return d.reshape(-1)

    build()  # eager
    with pytest.raises(torchdefer.TorchdeferError, match="cannot rebuild the history of a view"):
        torchdefer.deferred_init(build)
