"""Which unary elementwise overloads lay out a fresh output as eager does.

Pointwise ops of one tensor lay out their output in one of two ways on the
CPU and CUDA, and their meta kernels differ from both in size-1 and size-0
dimensions (``torch.rand(6, 1).t().abs()`` is ``(1, 1)``-strided in eager,
``(6, 1)`` on meta), so a fake output reported other strides than eager's,
and ``.view(dtype)`` of a part of it failed where eager's worked:

- ``ITERATED``: TensorIterator allocates the output (``fake/_iterator.py``);
- ``LIKE_INPUT``: the kernel allocates ``empty_like(self)`` and writes it with
  ``out=`` (``hardtanh``, ``relu6``, ``nan_to_num``, ``frexp``, ...).

The tables are what a sweep of every pointwise overload of one tensor over
many layouts and dtypes proved (``tests/fake/test_unary_layouts.py``, which
re-checks them against the installed torch). Overloads that neither rule
predicts (the ``.Scalar`` ones with a wrapped scalar operand, ``isinf`` and
``isfinite`` of integers, ``mvlgamma``, ``conj_physical``) keep the meta
kernel's layout.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ITERATED", "ITERATED_NAMES", "LIKE_INPUT", "LIKE_INPUT_NAMES"]

ITERATED_NAMES = """
abs acos acosh angle asin asinh atan atanh bitwise_not ceil celu clamp clamp_max clamp_min
clip cos cosh digamma elu erf erfc erfinv exp exp2 expm1 floor frac gelu hardshrink
hardsigmoid i0 isnan isneginf isposinf leaky_relu lgamma log log10 log1p log2 logical_not
logit mish neg polygamma pow.Tensor_Scalar reciprocal relu round rsqrt selu sgn sigmoid
sign signbit silu sin sinc sinh softplus softshrink special_airy_ai special_bessel_j0
special_bessel_j1 special_bessel_y0 special_bessel_y1 special_entr special_erfcx
special_i0e special_i1 special_i1e special_log_ndtr special_modified_bessel_i0
special_modified_bessel_i1 special_modified_bessel_k0 special_modified_bessel_k1
special_ndtri special_scaled_modified_bessel_k0 special_scaled_modified_bessel_k1
special_spherical_bessel_j0 sqrt square tan tanh threshold trunc
""".split()

# clone is laid out so too, by the _PRESERVING rule of fake/layout.py
LIKE_INPUT_NAMES = "deg2rad frexp.Tensor hardtanh nan_to_num rad2deg relu6".split()


def _overloads(names: list[str]) -> frozenset[Any]:
    """The overloads named ``op`` (its ``.default``) or ``op.overload`` that this torch has."""
    found = set()
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet, None), overload or "default", None)
        if op is not None:  # a torch without it: the test of the tables fails, not import
            found.add(op)
    return frozenset(found)


ITERATED = _overloads(ITERATED_NAMES)
LIKE_INPUT = _overloads(LIKE_INPUT_NAMES)
