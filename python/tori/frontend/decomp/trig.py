"""sin, cos and tan with tori's own argument reduction: IREE's CPU sin/cos lose
accuracy for arguments in the thousands, and float64 ones call libm's `sin`, which
IREE's CPU code does not link.

x = k·π/2 + r with k = round(x·2/π) and |r| ≲ π/4, r computed as x - k·P1 - k·P2 -
... (Cody and Waite): all but the last Pi are π/2 cut to a few significant bits each,
so that k·Pi is exact for k below 2**(mantissa bits - part bits), the last one the
rest, rounded. The exact products keep r's relative error small even next to the
multiples of π/2 (the zeros of sin and cos, the poles of tan).
sin and cos of r are minimax polynomials on [-π/4, π/4] (Cephes' coefficients); the
quadrant k mod 4 picks ±sin(r) or ±cos(r), tan is their quotient. This costs about
three times IREE's own sin (1.4 against 0.45 ms for a million float32 values), about
as much as eager's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten

_HALF_PI = Fraction(Decimal("1.570796326794896619231321691639751442098584699687552910487472296153908203143"))


def _split(value: Fraction, part_bits: int, parts: int, dtype: torch.dtype) -> tuple[float, ...]:
    """`value` as a sum of `parts` + 1 numbers of `dtype`: each of the first `parts`
    truncated to `part_bits` significant bits (its product with an integer of
    mantissa - part_bits bits is exact), the last one the rest, rounded."""
    terms = []
    for _ in range(parts):
        exponent = value.numerator.bit_length() - value.denominator.bit_length()
        if Fraction(2) ** exponent > value:
            exponent -= 1
        unit = Fraction(2) ** (exponent - part_bits + 1)
        term = math.floor(value / unit) * unit
        terms.append(float(term))
        value -= term
    terms.append(torch.tensor(float(value), dtype=torch.float64).to(dtype).item())
    return tuple(terms)


@dataclass(frozen=True)
class _Reduction:
    dtype: torch.dtype  # the type the reduction and the polynomials compute in
    part_bits: int
    half_pi: tuple[float, ...]
    sin: tuple[float, ...]  # sin(r) = r + r³·P(r²), highest power first
    cos: tuple[float, ...]  # cos(r) = 1 - r²/2 + r⁴·Q(r²)

    @property
    def exact_quadrants(self) -> int:
        """k·Pi is exact for |k| below this: the reduction is exact up to about
        this many times π/2."""
        mantissa_bits = 1 - int(math.log2(torch.finfo(self.dtype).eps))
        return 2 ** (mantissa_bits - self.part_bits)


_FLOAT32 = _Reduction(
    torch.float32, 8, _split(_HALF_PI, 8, 4, torch.float32),
    sin=(-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1),
    cos=(2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2),
)
_FLOAT64 = _Reduction(
    torch.float64, 23, _split(_HALF_PI, 23, 3, torch.float64),
    sin=(1.58962301576546568060e-10, -2.50507477628578072866e-8, 2.75573136213857245213e-6,
         -1.98412698295895385996e-4, 8.33333333332211858878e-3, -1.66666666666666307295e-1),
    cos=(-1.13585365213876817300e-11, 2.08757008419747316778e-9, -2.75573141792967388112e-7,
         2.48015872888517045348e-5, -1.38888888888730564116e-3, 4.16666666666665929218e-2),
)
# Half types compute in float32, like eager's CPU kernels.
_R_BOUND = math.pi / 2
_REDUCTIONS = {torch.float32: _FLOAT32, torch.float16: _FLOAT32, torch.bfloat16: _FLOAT32,
               torch.float64: _FLOAT64}


def _polynomial(z, coefficients):
    result = z * coefficients[0] + coefficients[1]
    for c in coefficients[2:]:
        result = result * z + c
    return result


def _reduce(x):
    """(sin r, cos r, quadrant k mod 4, result dtype) for x = k·π/2 + r, in the
    reduction's dtype; None where the input type is not covered."""
    if x.is_complex():
        return None
    dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    if dtype not in _REDUCTIONS:
        return None
    reduction = _REDUCTIONS[dtype]
    x = x.to(reduction.dtype)
    k = torch.round(x * (2 / math.pi))
    r = x
    for part in reduction.half_pi:
        r = r - k * part
    # Far past the exact range r is not reduced below π/4 and the polynomials would
    # grow to inf - inf: the value is inexact there (docs/limitations.md), but stays
    # finite and in [-1, 1]. NaN passes (its comparisons are false).
    r = torch.where(r > _R_BOUND, _R_BOUND, torch.where(r < -_R_BOUND, -_R_BOUND, r))
    z = r * r
    sin = r + r * z * _polynomial(z, reduction.sin)
    cos = 1.0 - 0.5 * z + z * z * _polynomial(z, reduction.cos)
    # Exact for any k: a float that large is a multiple of 4 (inf and NaN give NaN).
    quadrant = k - 4.0 * torch.floor(k * 0.25)
    return x, sin, cos, quadrant, dtype


def _by_quadrant(quadrant, values):
    q0, q1, q2, q3 = values
    return torch.where(quadrant == 1, q1, torch.where(quadrant == 2, q2, torch.where(quadrant == 3, q3, q0)))


# f(k·π/2 + r) from sin r, cos r and k mod 4.
_FORMULAS = {
    aten.sin.default: lambda s, c, quadrant: _by_quadrant(quadrant, (s, c, -s, -c)),
    aten.cos.default: lambda s, c, quadrant: _by_quadrant(quadrant, (c, -s, -c, s)),
    aten.tan.default: lambda s, c, quadrant: torch.where((quadrant == 1) | (quadrant == 3), -c / s, s / c),
}


@register_decomposition(*_FORMULAS)
def trigonometric(op, x):
    reduced = _reduce(x)
    if reduced is None:
        return NotImplemented
    x, s, c, quadrant, dtype = reduced
    result = _FORMULAS[op](s, c, quadrant)
    if op is not aten.cos.default:
        # sin and tan keep the sign of zero, which x - 0·P1 (+0 for x = -0) loses.
        result = torch.where(x == 0, x, result)
    return result.to(dtype)
