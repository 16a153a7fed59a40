"""Views of a tensor whose kernel lays out its output otherwise than its meta kernel.

Materialized in separate calls, the tensor and its view must share storage as
in eager (a write through one is seen by the other) and have eager's strides,
in either order (issue 24: `abs` of a permuted view with a size-1 dimension).

The fake tensors report eager's layout of a convolution now; ``unknown`` runs
the convolution cases as they were before (the meta kernel's layout recorded),
standing for any kernel whose layout torchdefer does not know.
"""

import pytest
import torch
import torch.nn.functional as F

import torchdefer
from torchdefer.errors import ReplayError


def _abs_of_a_permuted_size_1_view():
    t1 = torch.full((2, 3, 4), 2)
    t4 = t1.unsqueeze(0).permute(1, 0, 2, 3)
    base = t4.abs()  # eager (12, 12, 4, 1), meta (12, 24, 4, 1)
    view = base.permute(1, 0, 2, 3)
    base.copy_(base)
    return {"base": base, "view": view}


def _conv_of_channels_last():
    x = torch.arange(96.0).reshape(2, 3, 4, 4).to(memory_format=torch.channels_last)
    base = F.conv2d(x, torch.ones(5, 3, 3, 3))  # eager channels_last, meta contiguous (3x3: not 1x1)
    view = base[1, 2:]
    data = base.data
    base.mul_(2)  # a write after the views: the cache holds the storage at a later version
    return {"base": base, "view": view, "data": data}


def _out_into_a_view():
    x = torch.arange(96.0).reshape(2, 3, 4, 4).to(memory_format=torch.channels_last)
    base = F.conv2d(x, torch.ones(5, 3, 3, 3))
    view = base[0]
    torch.neg(view, out=view)
    base.mul_(2)
    return {"base": base, "view": view}


def _set_onto_it():
    x = torch.arange(96.0).reshape(2, 3, 4, 4).to(memory_format=torch.channels_last)
    base = F.conv2d(x, torch.ones(5, 3, 3, 3))
    other = torch.empty(0)
    other.set_(base)
    view = other.transpose(0, 1)
    base.mul_(2)
    return {"base": base, "view": view}


BUILDERS = [_abs_of_a_permuted_size_1_view, _conv_of_channels_last, _out_into_a_view,
            _set_onto_it]


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.fixture
def unknown_layout(monkeypatch):
    """Fake convolutions report the meta kernel's layout, not eager's."""
    from torchdefer.fake import _layout as layout

    monkeypatch.setattr(layout, "_convolution", lambda args, kwargs, out, device: out)


@pytest.mark.parametrize("build", BUILDERS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("order", ["base first", "views first"])
@pytest.mark.parametrize("layout", ["known", "unknown"])
def test_views_materialized_apart_share_storage_and_strides_with_eager(build, order, layout,
                                                                        request):
    if layout == "unknown":
        request.getfixturevalue("unknown_layout")
    eager = build()
    deferred = torchdefer.deferred_init(build)
    names = list(eager) if order == "base first" else list(reversed(eager))
    real = {name: torchdefer.materialize_tensor(deferred[name]) for name in names}
    for name, want in eager.items():
        got = real[name]
        assert (got.dtype, got.shape, got.stride(), got.storage_offset()) == (
            want.dtype, want.shape, want.stride(), want.storage_offset()), name
        assert torch.equal(got, want), name
        assert _shares(got, real["base"]) == _shares(want, eager["base"]), name
    # a later write through the view is seen by the base, as in eager
    real["view"].fill_(-7)
    eager["view"].fill_(-7)
    assert torch.equal(real["base"], eager["base"])


def test_the_fake_view_reports_what_it_reported_while_building():
    deferred = torchdefer.deferred_init(_abs_of_a_permuted_size_1_view)
    strides = deferred["view"].stride()
    torchdefer.materialize_tensor(deferred["base"])
    assert deferred["view"].stride() == strides  # still deferred, unchanged


def test_a_view_no_chain_of_views_leads_to_is_refused_not_copied(monkeypatch, unknown_layout):
    from torchdefer.materialize import _derive

    # Cut every chain: the view cannot be taken from its base again, and the
    # layouts differ beyond size-1 dimensions, so a rebuilt view would address
    # other elements and a replayed one would not share storage.
    monkeypatch.setattr(_derive, "_source", lambda value: None)
    x = torch.zeros(2, 3, 4, 4, device="meta").to(memory_format=torch.channels_last)
    if F.conv2d(x, torch.ones(5, 3, 3, 3, device="meta")).is_contiguous(
            memory_format=torch.channels_last):  # torch 2.8: meta's layout is eager's
        pytest.skip("this torch's meta convolution lays out as eager: nothing is relaid")
    deferred = torchdefer.deferred_init(_conv_of_channels_last)
    torchdefer.materialize_tensor(deferred["base"])
    with pytest.raises(ReplayError, match="cannot be rebuilt as eager's view") as info:
        torchdefer.materialize_tensor(deferred["view"])
    assert "test_views_of_relaid_storages.py" in str(info.value)


def test_a_view_no_chain_leads_to_shares_when_only_size_1_strides_differed(monkeypatch):
    from torchdefer.materialize import _derive

    monkeypatch.setattr(_derive, "_source", lambda value: None)
    eager = _abs_of_a_permuted_size_1_view()
    deferred = torchdefer.deferred_init(_abs_of_a_permuted_size_1_view)
    base = torchdefer.materialize_tensor(deferred["base"])
    view = torchdefer.materialize_tensor(deferred["view"])
    assert _shares(base, view)
    assert torch.equal(view, eager["view"])
    view.fill_(3)
    assert torch.equal(base, torch.full_like(base, 3))


def test_same_elements_ignores_only_strides_of_size_1_dimensions():
    from torchdefer.materialize._derive import same_elements
    from torchdefer.recorder._graph import TensorMeta

    def meta(size, stride, offset=0):
        return TensorMeta(size, stride, offset, torch.float32, torch.device("cpu"))

    for size, a, b in [((2, 1, 3), (3, 3, 1), (3, 99, 1)), ((0, 4), (4, 1), (1, 0))]:
        for x, y in [(a, b), (b, a)]:
            assert same_elements(meta(size, x), meta(size, y))
        # they address the same elements, as the real kernels say
        base = torch.arange(200.0)
        if 0 not in size:
            assert torch.equal(base.as_strided(size, a), base.as_strided(size, b))
    assert not same_elements(meta((2, 3), (3, 1)), meta((2, 3), (1, 2)))
    assert not same_elements(meta((2, 1), (1, 1), 0), meta((2, 1), (1, 1), 1))


def _x() -> torch.Tensor:
    """A tensor with a size-1 dimension strided oddly (made while building)."""
    return torch.arange(1.0, 9.0).reshape(2, 1, 4).permute(1, 0, 2)


NEIGHBOURS = {
    "size_0_abs": lambda: torch.ones(2, 0, 3).permute(1, 0, 2).abs(),
    "empty_like_of_a_strided_view": lambda: torch.empty_like(torch.ones(4, 6)[:, ::2]).fill_(1),
    "empty_like_of_an_expanded": lambda: torch.empty_like(torch.ones(4, 1).expand(4, 3)).fill_(1),
    "contiguous_of_a_size_1_permute": lambda: _x().contiguous(),
    "sum_keepdim": lambda: torch.ones(2, 3, 4).permute(2, 0, 1).sum(1, keepdim=True),
    "amax_keepdim_channels_last": lambda: torch.ones(2, 3, 4, 5).to(
        memory_format=torch.channels_last).amax(1, keepdim=True),
    "expand_clone_add_": lambda: torch.ones(3, 1).expand(3, 4).clone().add_(1),
    "channels_last_size_1_c": lambda: torch.ones(2, 1, 4, 5).to(
        memory_format=torch.channels_last).abs(),
    "channels_last_size_1_hw": lambda: torch.ones(2, 3, 1, 1).to(
        memory_format=torch.channels_last).relu(),
    "channels_last_size_1_w_times": lambda: torch.ones(2, 3, 4, 1).to(
        memory_format=torch.channels_last) * 2,
    "batch_norm_channels_last_size_1": lambda: F.batch_norm(
        torch.arange(6.0).reshape(2, 3, 1, 1).to(memory_format=torch.channels_last),
        None, None, training=True),
    "layer_norm_size_1": lambda: F.layer_norm(_x(), (4,)),
    "where_size_1": lambda: torch.where(_x() > 3, 1.0, 0.0),
    "hardtanh_size_1": lambda: F.hardtanh(_x()),
    "dropout_size_1": lambda: F.dropout(_x(), 0.5),
    "half_size_1": lambda: _x().half(),
    "pad_size_1": lambda: F.pad(_x(), (1, 1)),
    "interpolate_channels_last": lambda: F.interpolate(torch.ones(2, 3, 1, 4).to(
        memory_format=torch.channels_last), scale_factor=2),
    "group_norm_channels_last": lambda: F.group_norm(torch.ones(2, 4, 3, 3).to(
        memory_format=torch.channels_last), 2),
}


@pytest.mark.parametrize("name", sorted(NEIGHBOURS))
def test_neighbours_share_storage_with_a_view_materialized_apart(name):
    def build():
        y = NEIGHBOURS[name]()
        v = y.unsqueeze(0)
        y.mul_(2)
        return {"base": y, "view": v}

    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    real = {k: torchdefer.materialize_tensor(deferred[k]) for k in ("base", "view")}
    for key, want in eager.items():
        assert (real[key].stride(), real[key].storage_offset()) == (
            want.stride(), want.storage_offset()), key
        assert torch.equal(real[key], want), key
    assert _shares(real["base"], real["view"]) == _shares(eager["base"], eager["view"])
