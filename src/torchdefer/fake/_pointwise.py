"""How pointwise overloads lay out a fresh output in eager.

Pointwise ops of one tensor lay out their output in one of two ways on the
CPU and CUDA, and their meta kernels differ from both in size-1 and size-0
dimensions (``torch.rand(6, 1).t().abs()`` is ``(1, 1)``-strided in eager,
``(6, 1)`` on meta), so a fake output reported other strides than eager's,
and ``.view(dtype)`` of a part of it failed where eager's worked:

- ``ITERATED``: TensorIterator allocates the output (``fake/_iterator.py``),
  or ``WITH_SCALAR``: it does with the overload's scalar as a 0-d operand;
- ``LIKE_INPUT``: the kernel allocates ``empty_like(self)`` and writes it with
  ``out=`` (``hardtanh``, ``relu6``, ``nan_to_num``, ``frexp``, ...).

Binary ops of two tensors (a Python number counting as a 0-d tensor), and
four of three, likewise lay out as TensorIterator does (``BINARY_ITERATED``,
``TERNARY_ITERATED``); their meta
kernels differ in size-1 dimensions (``torch.ones(1, 37).t() * 2``).

The tables are what a sweep of every pointwise overload of one tensor, and
of two, over many layouts and dtypes proved
(``tests/fake/test_pointwise_layouts.py``, which re-checks them against the
installed torch). The overloads that neither rule predicts have their own
(``tests/fake/test_pointwise_layouts_rest.py`` sweeps them):

- ``CONTIGUOUS``: a row-major output whatever the input's layout: a scalar
  base (``pow.Scalar``, ``float_power.Scalar``: the structured meta function
  sets the output without strides), ``masked_fill`` (``clone(Contiguous)`` of
  the broadcast self); on the CPU ``log_sigmoid_forward`` too
  (``empty_like(Contiguous)``; CUDA keeps the meta kernel's layout, unchecked);
- ``BY_DTYPE``: integer ``isinf``/``isfinite`` are ``zeros_like``/``ones_like``
  (``LIKE_INPUT``), complex ``abs`` writes an ``empty_like`` of the real dtype,
  complex ``angle`` a row-major one; other dtypes as TensorIterator;
- ``ITERATED_OPERANDS``: TensorIterator over other operands than the leading
  tensors in order: ``lerp.Scalar`` (self, end), ``threshold_backward``
  (self, grad), ``clamp.Tensor`` (the bounds given), ``native_dropout_backward``
  (grad * mask, then * scale: a second fresh output).

Composite functions (``ldexp``, ``mvlgamma``, ``logsigmoid``, ``isclose``,
``conj_physical``...) decompose before a fake tensor sees them, into ops these
rules cover; ``rrelu`` in training draws (``fake/_layout.py``'s row-major rule).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "BINARY_ITERATED", "BINARY_ITERATED_NAMES", "BY_DTYPE", "BY_DTYPE_NAMES", "CONTIGUOUS",
    "CONTIGUOUS_NAMES", "CONTIGUOUS_ON_CPU", "CONTIGUOUS_ON_CPU_NAMES", "ITERATED",
    "ITERATED_NAMES", "ITERATED_OPERANDS", "ITERATED_OPERANDS_NAMES", "LIKE_INPUT",
    "LIKE_INPUT_NAMES", "TERNARY_ITERATED", "TERNARY_ITERATED_NAMES", "WITH_SCALAR",
    "WITH_SCALAR_NAMES", "dtype_kind",
]

ITERATED_NAMES = """
abs acos acosh angle asin asinh atan atanh bitwise_not ceil celu clamp clamp_max clamp_min
clip cos cosh digamma elu erf erfc erfinv exp exp2 expm1 float_power.Tensor_Scalar floor
frac gelu hardshrink
hardsigmoid i0 isnan isneginf isposinf leaky_relu lgamma log log10 log1p log2 logical_not
logit mish neg polygamma pow.Tensor_Scalar reciprocal relu round rsqrt selu sgn sigmoid
sign signbit silu sin sinc sinh softplus softshrink special_airy_ai special_bessel_j0
special_bessel_j1 special_bessel_y0 special_bessel_y1 special_entr special_erfcx
special_i0e special_i1 special_i1e special_log_ndtr special_modified_bessel_i0
special_modified_bessel_i1 special_modified_bessel_k0 special_modified_bessel_k1
special_ndtri special_scaled_modified_bessel_k0 special_scaled_modified_bessel_k1
special_spherical_bessel_j0 sqrt square tan tanh threshold trunc
""".split()

# TensorIterator's rule with the scalar as a 0-d operand (ATen wraps it so)
WITH_SCALAR_NAMES = """
__lshift__.Scalar __rshift__.Scalar __xor__.Scalar add.Scalar bitwise_and.Scalar
bitwise_and.Scalar_Tensor bitwise_left_shift.Scalar_Tensor
bitwise_left_shift.Tensor_Scalar bitwise_or.Scalar bitwise_or.Scalar_Tensor
bitwise_right_shift.Scalar_Tensor bitwise_right_shift.Tensor_Scalar bitwise_xor.Scalar
bitwise_xor.Scalar_Tensor copysign.Scalar div.Scalar eq.Scalar fmod.Scalar ge.Scalar
gt.Scalar le.Scalar lt.Scalar mul.Scalar ne.Scalar remainder.Scalar
remainder.Scalar_Tensor rsub.Scalar special_chebyshev_polynomial_t.n_scalar
special_chebyshev_polynomial_t.x_scalar special_chebyshev_polynomial_u.n_scalar
special_chebyshev_polynomial_u.x_scalar special_chebyshev_polynomial_v.n_scalar
special_chebyshev_polynomial_v.x_scalar special_chebyshev_polynomial_w.n_scalar
special_chebyshev_polynomial_w.x_scalar special_hermite_polynomial_h.n_scalar
special_hermite_polynomial_h.x_scalar special_hermite_polynomial_he.n_scalar
special_hermite_polynomial_he.x_scalar special_laguerre_polynomial_l.n_scalar
special_laguerre_polynomial_l.x_scalar special_legendre_polynomial_p.n_scalar
special_legendre_polynomial_p.x_scalar special_shifted_chebyshev_polynomial_t.n_scalar
special_shifted_chebyshev_polynomial_t.x_scalar
special_shifted_chebyshev_polynomial_u.n_scalar
special_shifted_chebyshev_polynomial_u.x_scalar
special_shifted_chebyshev_polynomial_v.n_scalar
special_shifted_chebyshev_polynomial_v.x_scalar
special_shifted_chebyshev_polynomial_w.n_scalar
special_shifted_chebyshev_polynomial_w.x_scalar special_xlog1py.other_scalar
special_xlog1py.self_scalar special_zeta.other_scalar special_zeta.self_scalar sub.Scalar
xlogy.Scalar_Other xlogy.Scalar_Self
""".split()

# clone is laid out so too, by the _PRESERVING rule of fake/_layout.py
LIKE_INPUT_NAMES = "_conj_physical deg2rad frexp.Tensor hardtanh nan_to_num rad2deg relu6".split()

# complex is TensorIterator's though not tagged pointwise (torch 2.8's meta kernel
# lays it out row-major). ldexp.Tensor is not (a composite of mul and pow); float_power
# converts its operands with .to(double) first (empty_like's layout), then iterates
# them (fake/_layout.py)
BINARY_ITERATED_NAMES = """
__lshift__.Tensor __rshift__.Tensor __xor__.Tensor add.Tensor atan2 bitwise_and.Tensor
bitwise_left_shift.Tensor bitwise_or.Tensor bitwise_right_shift.Tensor bitwise_xor.Tensor
clamp_max.Tensor clamp_min.Tensor complex copysign.Tensor div.Tensor eq.Tensor fmax fmin
fmod.Tensor gcd ge.Tensor gelu_backward gt.Tensor heaviside hypot igamma igammac lcm
float_power.Tensor_Tensor le.Tensor logaddexp logaddexp2 logical_and logical_or logical_xor
logit_backward lt.Tensor
max.other maximum min.other minimum mul.Tensor ne.Tensor nextafter pow.Tensor_Tensor
remainder.Tensor sigmoid_backward silu_backward special_chebyshev_polynomial_t
special_chebyshev_polynomial_u special_chebyshev_polynomial_v
special_chebyshev_polynomial_w special_hermite_polynomial_h special_hermite_polynomial_he
special_laguerre_polynomial_l special_legendre_polynomial_p
special_shifted_chebyshev_polynomial_t special_shifted_chebyshev_polynomial_u
special_shifted_chebyshev_polynomial_v special_shifted_chebyshev_polynomial_w
special_xlog1py special_zeta sub.Tensor tanh_backward true_divide.Tensor xlogy.Tensor
""".split()

# ops of three tensors: TensorIterator's rule over them in order
TERNARY_ITERATED_NAMES = "addcdiv addcmul lerp.Tensor where.self".split()


CONTIGUOUS_NAMES = "float_power.Scalar masked_fill.Scalar masked_fill.Tensor pow.Scalar".split()
CONTIGUOUS_ON_CPU_NAMES = ["log_sigmoid_forward"]

# overload -> {dtype kind: rule} (kinds: dtype_kind); a kind not named: "iterated".
# "like_input_if_filled": LIKE_INPUT, but TensorIterator's for a tensor with no
# elements (complex isinf: isinf(real) | isinf(imag) short-cut where it can).
BY_DTYPE_NAMES: dict[str, dict[str, str]] = {
    "abs": {"complex": "like_input"},
    "angle": {"complex": "contiguous"},
    "isinf": {"integral": "like_input", "complex": "like_input_if_filled"},
    "isfinite": {"integral": "like_input"},
}

# overload -> (indices of TensorIterator's operands in its order, then a second
# fresh output with a scalar); an absent (None) operand is left out.
ITERATED_OPERANDS_NAMES: dict[str, tuple[tuple[int, ...], bool]] = {
    "clamp.Tensor": ((0, 1, 2), False),
    "lerp.Scalar": ((0, 1), False),
    "native_dropout_backward": ((0, 1), True),
    "threshold_backward": ((1, 0), False),
}


def dtype_kind(dtype: torch.dtype) -> str:
    """'complex', 'floating' or 'integral' (bool included): how ``BY_DTYPE`` tells dtypes."""
    if dtype.is_complex:
        return "complex"
    return "floating" if dtype.is_floating_point else "integral"


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
BINARY_ITERATED = _overloads(BINARY_ITERATED_NAMES)
WITH_SCALAR = _overloads(WITH_SCALAR_NAMES)
TERNARY_ITERATED = _overloads(TERNARY_ITERATED_NAMES)
CONTIGUOUS = _overloads(CONTIGUOUS_NAMES)
CONTIGUOUS_ON_CPU = _overloads(CONTIGUOUS_ON_CPU_NAMES)
BY_DTYPE = {op: BY_DTYPE_NAMES[name] for name in BY_DTYPE_NAMES
            for op in _overloads([name])}
ITERATED_OPERANDS = {op: ITERATED_OPERANDS_NAMES[name] for name in ITERATED_OPERANDS_NAMES
                     for op in _overloads([name])}
