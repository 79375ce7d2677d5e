"""Special functions written in torch ops after ATen's CPU kernels (tori.frontend.decomp.special):
compiled natively, they match eager over their ranges and at the edges."""

import math

import pytest
import torch

from tori.testing import assert_matches_eager

special = torch.special

UNARY = [special.airy_ai, special.bessel_y0, special.bessel_y1, special.modified_bessel_i0,
         special.modified_bessel_i1, special.modified_bessel_k0, special.modified_bessel_k1,
         special.scaled_modified_bessel_k0, special.scaled_modified_bessel_k1]

EDGES = [math.inf, -math.inf, math.nan, 0.0, -0.0, 1e-30, -1e-30, 1e-5, 2.0, -2.0, 2.09, -2.09, 5.0, 8.0, -8.0,
         8.3203353, 103.892, 120.0, -120.0]


def test_bessel_and_airy_functions_match_eager_over_their_ranges():
    # Every range of each approximation: the series, the asymptotic forms and the
    # special values (zero, negative, infinite, NaN).
    x = torch.cat([torch.linspace(-60, 60, 1201), torch.linspace(-3, 3, 601), torch.tensor(EDGES)])
    assert_matches_eager(lambda t: [f(t) for f in UNARY], x, rtol=1e-5, atol=1e-5)


def test_integer_inputs_compute_in_the_default_float_dtype():
    x = torch.arange(-3, 12)
    out = assert_matches_eager(lambda t: (special.modified_bessel_k1(t), special.bessel_y0(t)), x, rtol=1e-5, atol=1e-5)
    assert out[0].dtype == torch.float32


def test_half_precision_is_left_to_fail_as_in_eager():
    from tori.frontend.decomp.special import airy_ai

    assert airy_ai(None, torch.ones(3, dtype=torch.float16)) is NotImplemented
    with pytest.raises(RuntimeError):
        special.airy_ai(torch.ones(3, dtype=torch.float16))


POLYNOMIALS = [special.chebyshev_polynomial_t, special.chebyshev_polynomial_u, special.chebyshev_polynomial_v,
               special.chebyshev_polynomial_w, special.shifted_chebyshev_polynomial_t,
               special.shifted_chebyshev_polynomial_u, special.shifted_chebyshev_polynomial_v,
               special.shifted_chebyshev_polynomial_w, special.hermite_polynomial_h, special.hermite_polynomial_he,
               special.laguerre_polynomial_l, special.legendre_polynomial_p]


def test_hermite_polynomial_of_a_tensor_n_matches_eager_for_every_n():
    # ATen returns NaN past n = 128 in float32, so 128 unrolled steps cover every n,
    # including those that are not integers, negative, infinite or NaN.
    x = torch.tensor([-2.5, -1.0, -0.3, 0.0, 0.7, 1.0, 2.5, math.nan, math.inf])[:, None]
    n = torch.tensor([-2.0, 0.0, 1.0, 2.0, 3.7, 9.0, 40.0, 128.0, 129.0, 1e19, math.nan, math.inf, -math.inf])
    assert_matches_eager(special.hermite_polynomial_h, x, n, rtol=1e-5, atol=1e-5)


def test_polynomials_of_a_python_number_n_match_eager():
    # n = 9: past 6 (or 8, 4) Chebyshev's closed forms take over inside (-1, 1); the
    # recurrence outside, and the special values at the ends.
    x = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.25, 0.5, 0.9, 1.0, 1.5])
    assert_matches_eager(lambda x: [f(x, 9) for f in POLYNOMIALS], x, rtol=1e-5, atol=1e-5)
