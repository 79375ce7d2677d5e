"""The orthogonal polynomials of torch.special of a tensor degree n, written in torch
ops (tori.frontend.decomp.polynomials): compiled natively, they match eager."""

import math

import torch

from tori.frontend.decomp.polynomials import UNROLLED_STEPS
from tori.testing import assert_matches_eager, count_graphs

special = torch.special

CHEBYSHEV = [special.chebyshev_polynomial_t, special.chebyshev_polynomial_u, special.chebyshev_polynomial_v,
             special.chebyshev_polynomial_w, special.shifted_chebyshev_polynomial_t,
             special.shifted_chebyshev_polynomial_u, special.shifted_chebyshev_polynomial_v,
             special.shifted_chebyshev_polynomial_w]


def _compiled(fn, *args):
    """fn(*args) compiled by tori with fallback='error', checked to have run compiled."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tori", fullgraph=True, options={"fallback": "error"})
    with count_graphs() as count:
        out = compiled(*args)
    assert count.compiled_graphs == 1 and count.compiled_calls == 1 and count.fallback_calls == 0, count.delta
    return out


def test_chebyshev_polynomials_of_a_float_n_match_eager():
    # x: both ends of [-1, 1], inside and outside (not NaN: ATen's U, V, W leave their
    # result unset there and return whatever it holds); n: negative, truncated, the
    # recurrence (up to 16 steps), ATen's trigonometric forms inside (-1, 1) past
    # n = 6 or 8, the hyperbolic forms outside past 16 (up to overflow: eager's inf,
    # then its NaN from two steps on), NaN and inf (as a negative n: 0).
    x = torch.tensor([-9.0, -2.5, -1.0000001, -1.0, -0.7, -0.3, 0.0, 0.25, 0.9, 1.0, 1.0000001, 1.02, 3.0])[:, None]
    small = [-4.0, -0.5, 0.0, 0.9, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 12.0, 16.0, 17.0, 20.0, math.nan, math.inf]
    large = [40.0, 58.0, 59.0, 60.0, 300.0, 1000.0]
    n = torch.tensor(small + large)
    functions = CHEBYSHEV[:4]
    outs = _compiled(lambda x, n: [f(x, n) for f in functions], x, n)

    for f, out in zip(functions, outs):
        eager, exact = f(x, n), f(x.double(), n.double()).float()
        torch.testing.assert_close(out[:, :len(small)], eager[:, :len(small)], rtol=1e-5, atol=1e-5, equal_nan=True)
        # Large n: eager's float32 is off by about n ulp inside (-1, 1), where nθ
        # rounds, and its recurrence drifts outside (0.2 % at x = 1 + 2**-23, n = 1000);
        # tori's are within that of eager, and close to the exact (float64) value.
        out, eager, exact = out[:, len(small):], eager[:, len(small):], exact[:, len(small):]
        torch.testing.assert_close(out, eager, rtol=3e-3, atol=3e-4, equal_nan=True)
        finite = torch.isfinite(exact)
        torch.testing.assert_close(out[finite], exact[finite], rtol=2e-5, atol=2e-4)
    overflowing = outs[0][1, len(small) + 1:len(small) + 4].tolist()  # T_58, T_59, T_60 of -2.5
    assert overflowing[:2] == [math.inf, -math.inf] and math.isnan(overflowing[2])


def test_shifted_chebyshev_polynomials_of_an_integer_n_match_eager():
    # The shifted forms' ends are x = 0 and x = 1.
    x = torch.tensor([-0.6, -0.2, 0.0, 0.1, 0.3, 0.5, 0.8, 1.0, 1.2, 2.0])[:, None]
    n = torch.tensor([-2, 0, 1, 2, 3, 4, 5, 6, 7, 9, 16, 17, 25, 40])
    assert_matches_eager(lambda x, n: [f(x, n) for f in CHEBYSHEV[4:]], x, n, rtol=1e-5, atol=1e-5)


def test_laguerre_and_legendre_give_nan_past_their_unrolled_steps():
    # No closed form: UNROLLED_STEPS (64) recurrence steps; past them NaN, never a
    # value from too few steps, except where the value holds for every n (L_n(0) = 1,
    # P_n(±1) = ±1). An n of NaN counts as negative: 0, as in eager.
    x = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.3, 1.0, 2.0, 8.0, math.nan])[:, None]
    n = torch.tensor([-1.0, 0.0, 1.0, 2.0, 7.5, 20.0, 40.0, 63.0, UNROLLED_STEPS, math.nan, UNROLLED_STEPS + 1.0,
                      1000.0])
    beyond = n > UNROLLED_STEPS
    laguerre, legendre = _compiled(lambda x, n: (special.laguerre_polynomial_l(x, n),
                                                 special.legendre_polynomial_p(x, n)), x, n)

    for out, f in ((laguerre, special.laguerre_polynomial_l), (legendre, special.legendre_polynomial_p)):
        eager = f(x, n)
        torch.testing.assert_close(out[:, ~beyond], eager[:, ~beyond], rtol=1e-5, atol=1e-5, equal_nan=True)
        assert torch.isfinite(eager[2, beyond]).all()  # eager's values at x = -0.5, not tori's
    laguerre, legendre = laguerre[:, beyond], legendre[:, beyond]
    zero, ends = (x == 0.0).expand_as(laguerre), (x.abs() == 1.0).expand_as(legendre)
    assert laguerre[~zero].isnan().all() and (laguerre[zero] == 1.0).all()
    assert legendre[~ends].isnan().all()
    torch.testing.assert_close(legendre[ends], special.legendre_polynomial_p(x, n)[:, beyond][ends])
