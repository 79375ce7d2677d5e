"""The orthogonal polynomials of torch.special (Chebyshev T, U, V, W and their shifted
forms, Hermite H and He, Laguerre L, Legendre P) of a degree n that may be a tensor:
ATen's three-term recurrence unrolled to a fixed number of steps, closed forms past it.

ATen evaluates P_n(x) element by element: n (truncated to an integer) recurrence steps,
except where a closed form holds (Chebyshev inside (-1, 1) past a small n) and at
special points. Here the recurrence is unrolled, each element keeping its P_n once
reached, for as many steps as its n can ask for: a Python number n or an n of a small
integer dtype bounds them. Any other tensor n is unbounded, and past the unrolled steps:

- Chebyshev (16 steps): inside (-1, 1) ATen's own trigonometric forms, which it
  takes from n = 5 to 9 on; outside, the hyperbolic forms (cosh(n·acosh|x|) and its
  kin for U, V, W, with the sign of x^n) in float64, rounded once. Those are closer
  to the exact value than ATen's float32 recurrence, whose rounding grows with n
  (2e-5 relative at n = 64); like it, they overflow to inf, and give NaN once the
  value two steps back has overflowed (where the recurrence subtracts inf from inf).
- Hermite (128 steps in float32, 512 in float64): ATen returns NaN past them.
- Laguerre and Legendre (64 steps, `UNROLLED_STEPS`): no closed form; NaN past
  them, never a value from too few steps (docs/limitations.md).

Eager has no float16 or bfloat16 kernel for these ops; they are left to fail there.
"""

from __future__ import annotations

import functools
import math

import torch

from tori.frontend.decomp.special import _select
from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten

# Steps unrolled for Laguerre and Legendre when n is a tensor that may hold any value.
UNROLLED_STEPS = 64
_CHEBYSHEV_STEPS = 16
_HERMITE_LIMIT = {torch.float32: 128, torch.float64: 512}
_N_BOUND = {torch.bool: 1, torch.uint8: 255, torch.int8: 127}
_MAX_SCALAR_N = 256


def _even(n: torch.Tensor) -> torch.Tensor:
    return torch.remainder(n, 2.0) == 0.0


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.dtype == torch.float32 else t


def _fused(a: torch.Tensor, q: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """a * q - t rounded once, as the compiled kernels contract it (an FMA), with `a`
    already `_wide`: exact for float32 through float64, where a * q is exact."""
    return (a * _wide(q) - _wide(t)).to(q.dtype)


def _recurrence(first: torch.Tensor, step, n: torch.Tensor, steps: int) -> torch.Tensor:
    """P_n for 0 <= n <= steps, where P_0 = 1, P_1 = first and P_{k+1} = step(k, P_k, P_{k-1}):
    each element keeps its P_n once reached. (Keeping every P_k for a final pick made
    IREE read them all in one dispatch, past its runtime's 64 bindings.)"""
    p, q = torch.ones_like(first), first
    for k in range(1, steps):
        r = step(k, q, p)
        going = n > float(k)
        p, q = torch.where(going, q, p), torch.where(going, r, q)
    return torch.where(n == 0.0, torch.ones_like(q), q)


def _hyperbolic(kind: str, y: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Chebyshev's P_n(y) for |y| > 1. With |y| = cosh(a): T_n = cosh(na),
    U_n = sinh((n+1)a) / sinh(a), V_n = cosh((n+½)a) / cosh(a/2), W_n = sinh((n+½)a) / sinh(a/2);
    for y < 0, P_n(y) = (-1)^n P_n(|y|) for T and U, while V and W trade their forms."""
    wide = _wide(y)
    a = torch.acosh(torch.abs(wide))
    negative = wide < 0.0

    def at(m: torch.Tensor) -> torch.Tensor:
        m = _wide(m)
        if kind == "t":
            value = torch.cosh(m * a)
        elif kind == "u":
            value = torch.sinh((m + 1.0) * a) / torch.sinh(a)
        else:
            cosine = torch.cosh((m + 0.5) * a) / torch.cosh(0.5 * a)
            sine = torch.sinh((m + 0.5) * a) / torch.sinh(0.5 * a)
            value = torch.where(negative, sine, cosine) if kind == "v" else torch.where(negative, cosine, sine)
        return torch.where(negative & ~_even(m), -value, value).to(y.dtype)

    # ATen's recurrence reaches inf, then inf - inf: NaN once P_{n-2} overflowed.
    return torch.where(torch.isinf(at(n - 2.0)), math.nan, at(n))


def _acos(y: torch.Tensor) -> torch.Tensor:
    """acos of a float64 y in (-1, 1) to float64 accuracy: IREE has no float64 acos,
    so float32's, refined by a Newton step on cos(θ) = y (which squares its error)."""
    theta = torch.acos(y.float()).double()
    return theta + (torch.cos(theta) - y) / torch.sin(theta)


def _rounded_once(function, t: torch.Tensor) -> torch.Tensor:
    """function(t) in float64, rounded to t's dtype: the correctly rounded float32
    result that glibc's acosf, sinf and cosf give eager (IREE's own are a few ulp off,
    which nθ multiplies)."""
    return function(_wide(t)).to(t.dtype)


def _chebyshev(kind: str, x, n, steps: int, shifted: bool):
    """ATen's chebyshev_polynomial_{t,u,v,w} and their shifted forms."""
    y = x + x - 1.0 if shifted else x
    first = {"t": y, "u": y + y, "v": y + y - 1.0, "w": y + y + 1.0}[kind]
    twice = _wide(y + y)
    recurrence = _recurrence(first, lambda k, q, p: _fused(twice, q, p), n, steps)
    # ATen's closed forms for |y| < 1, in its order of operations: with y = cos(θ),
    # T_n = cos(nθ), U_n = sin((n+1)θ) / sin(θ), V_n = cos((n+½)θ) / cos(θ/2),
    # W_n = sin((n+½)θ) / sin(θ/2), each with its guard against a zero divisor.
    theta = _rounded_once(_acos, y)
    sin, cos = functools.partial(_rounded_once, torch.sin), functools.partial(_rounded_once, torch.cos)
    even = _even(n)
    odd_sign = torch.where(even, 1.0, -1.0).to(x.dtype)
    if kind == "t":
        closed = cos(n * theta)
    elif kind == "u":
        s = sin(theta)
        closed = torch.where(s != 0.0, sin((n + 1.0) * theta) / s, (n + 1.0) * cos((n + 1.0) * theta) / y)
    elif kind == "v":
        closed = torch.where(sin(theta / 2.0) != 1.0, cos((n + 0.5) * theta) / cos(theta / 2.0),
                             odd_sign * (n + n + 1.0))
    else:
        fallback = odd_sign if shifted else torch.where(x > 0.0, n + n + 1.0, odd_sign)
        closed = torch.where(cos(theta / 2.0) != 1.0, sin((n + 0.5) * theta) / sin(theta / 2.0), fallback)
    # The values at x = ±1 (y = ±1 for the shifted ones, at x = 1 and x = 0).
    top = {"t": torch.ones_like(x), "u": n + 1.0, "v": torch.ones_like(x), "w": n + n + 1.0}[kind]
    bottom = {"t": odd_sign, "u": odd_sign * (n + 1.0), "v": odd_sign * (n + n + 1.0), "w": odd_sign}[kind]
    if kind in ("t", "u") and not shifted:
        bottom = torch.where(even, top, bottom)
    past = {"t": 6, "u": 8, "v": 8, "w": 8}[kind] if not shifted else {"t": 6, "u": 6, "v": 6, "w": 4}[kind]
    at_top, at_bottom = (x == 1.0, x == 0.0) if shifted else (x == 1.0, x == -1.0)
    return _select(
        (n < 0.0, 0.0),
        (at_top, top),
        (at_bottom, bottom),
        ((n > past) & (torch.abs(y) < 1.0), closed),
        (n > float(steps), _hyperbolic(kind, y, n)),
        otherwise=recurrence,
    )


def _hermite_h(x, n, steps: int):
    twice = _wide(x + x)
    recurrence = _recurrence(x + x, lambda k, q, p: _fused(twice, q, float(2 * k) * p), n, steps)
    return _select((n < 0.0, 0.0), (n > _HERMITE_LIMIT[x.dtype], math.nan), otherwise=recurrence)


def _hermite_he(x, n, steps: int):
    wide = _wide(x)
    recurrence = _recurrence(x, lambda k, q, p: _fused(wide, q, float(k) * p), n, steps)
    return _select((n < 0.0, 0.0), (n > _HERMITE_LIMIT[x.dtype], math.nan), otherwise=recurrence)


def _laguerre_l(x, n, steps: int):
    recurrence = _recurrence(
        1.0 - x, lambda k, q, p: _fused(_wide(float(k + k) + (1.0 - x)), q, float(k) * p) / float(k + 1), n, steps)
    return _select((n < 0.0, 0.0), (torch.abs(x) == 0.0, 1.0), (n > float(steps), math.nan), otherwise=recurrence)


def _legendre_p(x, n, steps: int):
    recurrence = _recurrence(
        x, lambda k, q, p: _fused(_wide(float(k + k + 1) * x), q, float(k) * p) / float(k + 1), n, steps)
    sign = torch.where((x > 0.0) | _even(n), 1.0, -1.0).to(x.dtype)
    return _select((n < 0.0, 0.0), (torch.abs(x) == 1.0, sign), (n > float(steps), math.nan), otherwise=recurrence)


def _chebyshev_entry(kind: str, shifted: bool):
    return lambda x, n, steps: _chebyshev(kind, x, n, steps, shifted)


# Each op's evaluation, and the steps past which its value no longer needs the
# recurrence (closed forms, or ATen's own NaN), by dtype; None: every step counts.
_POLYNOMIALS = {
    aten.special_chebyshev_polynomial_t: (_chebyshev_entry("t", False), lambda dtype: _CHEBYSHEV_STEPS),
    aten.special_chebyshev_polynomial_u: (_chebyshev_entry("u", False), lambda dtype: _CHEBYSHEV_STEPS),
    aten.special_chebyshev_polynomial_v: (_chebyshev_entry("v", False), lambda dtype: _CHEBYSHEV_STEPS),
    aten.special_chebyshev_polynomial_w: (_chebyshev_entry("w", False), lambda dtype: _CHEBYSHEV_STEPS),
    aten.special_shifted_chebyshev_polynomial_t: (_chebyshev_entry("t", True), lambda dtype: _CHEBYSHEV_STEPS),
    aten.special_shifted_chebyshev_polynomial_u: (_chebyshev_entry("u", True), lambda dtype: _CHEBYSHEV_STEPS),
    aten.special_shifted_chebyshev_polynomial_v: (_chebyshev_entry("v", True), lambda dtype: _CHEBYSHEV_STEPS),
    aten.special_shifted_chebyshev_polynomial_w: (_chebyshev_entry("w", True), lambda dtype: _CHEBYSHEV_STEPS),
    aten.special_hermite_polynomial_h: (_hermite_h, _HERMITE_LIMIT.get),
    aten.special_hermite_polynomial_he: (_hermite_he, _HERMITE_LIMIT.get),
    aten.special_laguerre_polynomial_l: (_laguerre_l, lambda dtype: None),
    aten.special_legendre_polynomial_p: (_legendre_p, lambda dtype: None),
}


def _as_integer(n: torch.Tensor) -> torch.Tensor:
    """n as ATen's static_cast<int64_t> leaves it on x86: truncated toward zero, and
    NaN, infinities and values out of int64's range become INT64_MIN (negative: -1 here)."""
    n = torch.trunc(n)
    return torch.where(torch.abs(n) < 2.0 ** 63, n, -1.0)


def _polynomial(op, x, n):
    evaluate, limit = _POLYNOMIALS[op.overloadpacket]
    dtype = torch.result_type(x, n)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if dtype not in (torch.float32, torch.float64):
        return NotImplemented
    enough = limit(dtype)
    if isinstance(n, torch.Tensor):
        steps = _N_BOUND.get(n.dtype, UNROLLED_STEPS if enough is None else math.inf)
        if not isinstance(x, torch.Tensor):
            x = torch.full_like(n, x, dtype=dtype)
        x, n = torch.broadcast_tensors(x.to(dtype), _as_integer(n.to(dtype)))
    else:
        n = float(n)
        whole = math.trunc(n) if math.isfinite(n) and abs(n) < 2.0 ** 63 else -1
        steps = max(whole if enough is None else min(whole, enough), 1)
        if steps > _MAX_SCALAR_N:
            return NotImplemented
        x = x.to(dtype)
        n = torch.full_like(x, float(whole))
    if enough is not None:
        steps = min(steps, enough)
    return evaluate(x, n, steps)


for _packet in _POLYNOMIALS:
    register_decomposition(_packet.default, _packet.x_scalar, _packet.n_scalar)(_polynomial)
