"""Binary elementwise ops whose meta kernels lay out otherwise than TensorIterator.

``copysign``, ``xlogy``, ``div(rounding_mode=...)``, ``floor_divide`` of a
transposed tensor: eager keeps the transposed order, the meta kernels gave a
contiguous output, so a ``reshape`` of the fake output viewed what eager
copied, and a write through it reached the tensor (issue 24, found sweeping
the pointwise ops for layouts the meta kernels give otherwise).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdefer
from torchdefer.fake._iterator import iterator_strides

OPS = {
    "copysign": torch.copysign,
    "xlogy": torch.xlogy,
    "xlog1py": torch.special.xlog1py,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "floor_divide": torch.floor_divide,
}
PAIRS = {
    "transposed_and_0d": lambda: (torch.arange(1.0, 51.0).reshape(5, 10).t(), torch.tensor(2.0)),
    "transposed_and_row": lambda: (torch.arange(1.0, 51.0).reshape(5, 10).t(), torch.full((1, 5), 3.0)),
    "transposed_and_contiguous": lambda: (torch.arange(1.0, 51.0).reshape(5, 10).t(),
                                          torch.full((10, 5), 3.0)),
    "0d_and_transposed": lambda: (torch.tensor(2.0), torch.arange(1.0, 51.0).reshape(5, 10).t()),
    "permuted_3d": lambda: (torch.arange(1.0, 25.0).reshape(2, 3, 4).permute(2, 0, 1),
                            torch.full((4, 1, 3), 3.0)),
    "channels_last": lambda: (torch.arange(1.0, 121.0).reshape(2, 3, 4, 5).contiguous(
        memory_format=torch.channels_last), torch.tensor(2.0)),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_the_fake_output_has_eagers_strides_and_a_reshape_copies_as_in_eager(op, pair):
    def build():
        out = OPS[op](*PAIRS[pair]())
        flat = out.reshape(-1)  # a view only where the layout allows one
        flat.fill_(0.5)
        return out, flat

    eager = build()
    deferred = torchdefer.deferred_init(build)
    assert deferred[0].stride() == eager[0].stride()
    for got, want in zip(deferred, eager):
        real = torchdefer.materialize_tensor(got)
        assert real.stride() == want.stride() and torch.equal(real, want)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_iterator_strides_are_atens_for_any_layouts(data):
    ndim = data.draw(st.integers(1, 4))
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))

    def operand():
        perm = data.draw(st.permutations(range(ndim)))
        t = torch.zeros([shape[p] for p in perm]).permute([perm.index(i) for i in range(ndim)])
        kind = data.draw(st.sampled_from(["full", "0d", "broadcast", "sliced"]))
        if kind == "0d":
            return torch.tensor(1.0)
        if kind == "broadcast":
            dim = data.draw(st.integers(0, ndim - 1))
            return t.narrow(dim, 0, 1)
        if kind == "sliced":
            return torch.zeros([n * 2 for n in shape])[tuple(slice(None, None, 2) for _ in shape)]
        return t

    a, b = operand(), operand()
    eager = torch.copysign(a, b)  # a TensorIterator op with a fresh output
    got = iterator_strides([(tuple(a.shape), a.stride()), (tuple(b.shape), b.stride())],
                           tuple(eager.shape))
    assert got == eager.stride(), (a.shape, a.stride(), b.shape, b.stride())
