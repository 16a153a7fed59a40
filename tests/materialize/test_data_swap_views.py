"""Views taken before ``t.data = other``: they keep the old storage, dtype and shape,
and answer ``requires_grad`` from their autograd base, as eager's do (issue 24).

An integer view of a base later given float data and ``requires_grad_()``
reports ``requires_grad=True`` in eager; materializing it raised "only Tensors
of floating point dtype can require gradients".
"""

import pytest
import torch

import torchdefer

PROGRAMS = {
    "int view, float data": "t3 = torch.zeros(3, 2, dtype=torch.long); t4 = t3.flatten(); "
                            "t5 = t3[0]; t3.data = torch.ones(4, 4); t3.requires_grad_()",
    "int view, new shape": "t3 = torch.arange(6, dtype=torch.int32).reshape(3, 2); t4 = t3.t(); "
                           "t3.data = torch.ones(7); t3.requires_grad_()",
    "bool view, complex data": "t3 = torch.ones(4, dtype=torch.bool); t4 = t3[1:]; "
                               "t3.data = torch.ones(2, dtype=torch.complex64); "
                               "t3.requires_grad_()",
    "view of a view": "t3 = torch.arange(8).reshape(4, 2); t4 = t3[1:]; t5 = t4[0]; "
                      "t3.data = torch.ones(2); t3.requires_grad_()",
    "float view, double data": "t3 = torch.arange(6.0).reshape(3, 2); t4 = t3[0]; "
                               "t3.data = torch.ones(5, dtype=torch.float64); "
                               "t3.requires_grad_()",
    "grad switched off again": "t3 = torch.arange(4); t4 = t3[:2]; t3.data = torch.ones(2); "
                               "t3.requires_grad_(); t3.requires_grad_(False)",
    ".data of the int view": "t3 = torch.arange(4); t4 = t3.view(2, 2); "
                             "t3.data = torch.ones(2); t3.requires_grad_(); t6 = t4.data",
}


def _run(code: str) -> dict:
    namespace = {"torch": torch}
    exec(code, namespace)
    return {k: v for k, v in namespace.items() if k[0] == "t" and k[1:].isdigit()}


@pytest.mark.parametrize("name", list(PROGRAMS))
@pytest.mark.parametrize("reverse", [False, True], ids=["in order", "reversed"])
def test_views_kept_across_a_data_swap_materialize_as_eager_has_them(name, reverse):
    eager = _run(PROGRAMS[name])
    deferred = torchdefer.deferred_init(_run, PROGRAMS[name])
    for key in sorted(eager, reverse=reverse):
        want = eager[key]
        fake = deferred[key]
        assert (fake.dtype, fake.shape, fake.requires_grad) == (
            want.dtype, want.shape, want.requires_grad), key
        got = torchdefer.materialize_tensor(fake)
        assert (got.dtype, got.shape, got.stride(), got.device) == (
            want.dtype, want.shape, want.stride(), want.device), key
        assert (got.requires_grad, got.is_leaf, got.grad_fn) == (
            want.requires_grad, want.is_leaf, want.grad_fn), key
        if want.device.type != "meta":
            assert torch.equal(got.detach(), want.detach()), key


def test_a_materialized_int_view_requiring_grad_still_shares_its_storage():
    code = PROGRAMS["int view, float data"]
    eager = _run(code)
    deferred = torchdefer.deferred_init(_run, code)
    t4, t5 = (torchdefer.materialize_tensor(deferred[k]) for k in ("t4", "t5"))
    assert t4.untyped_storage().data_ptr() == t5.untyped_storage().data_ptr()
    assert eager["t4"].untyped_storage().data_ptr() == eager["t5"].untyped_storage().data_ptr()
    # in place through such a view is refused in eager and on the real tensor alike
    with pytest.raises(RuntimeError, match="view of a leaf Variable"):
        eager["t4"].add_(1)
    with pytest.raises(RuntimeError, match="view of a leaf Variable"):
        t4.add_(1)


def test_data_of_another_device_is_refused_at_the_call_as_in_eager():
    code = "t3 = torch.arange(4.0); t4 = t3[1:]; t3.data = torch.ones(2, device='meta')"
    with pytest.raises(RuntimeError, match="incompatible tensor type") as eager:
        _run(code)
    with pytest.raises(RuntimeError, match="incompatible tensor type") as deferred:
        torchdefer.deferred_init(_run, code)
    assert type(deferred.value) is type(eager.value)
