"""The error-function family that IREE does not lower (erfc, erfcx, erfinv, ndtri),
from IREE's erf and exp: a continued fraction where 1 - erf(x) would cancel, Newton
steps on erf or on log Φ to reach float32 accuracy. Half precision computes in float32
and rounds, as eager's CPU kernels do."""

from __future__ import annotations

import math

import torch

from tori.frontend.decomp.floating import in_float32
from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten

_TAIL_FROM = 1.5  # below, 1 - erf(x) keeps float32 accuracy
_FRACTION_TERMS = 20  # relative error 1.4e-7 at 1.5, less beyond
_1_SQRT_PI = 1 / math.sqrt(math.pi)


def _erfcx_tail(x: torch.Tensor) -> torch.Tensor:
    """exp(x²)·erfc(x) for x ≥ 1.5 by Laplace's continued fraction
    1/√π / (x + (1/2)/(x + (2/2)/(x + (3/2)/(x + …)))), evaluated from its tail."""
    x = torch.clamp_min(x, _TAIL_FROM)  # elsewhere unused; keeps the fraction finite
    t = x
    for k in range(_FRACTION_TERMS, 0, -1):
        t = x + (k / 2) / t
    return _1_SQRT_PI / t


def _erfc(x: torch.Tensor) -> torch.Tensor:
    tail = torch.exp(-(x * x)) * _erfcx_tail(x)
    return torch.where(x >= _TAIL_FROM, tail, 1 - torch.erf(x))


def _erfcx(x: torch.Tensor) -> torch.Tensor:
    # Below -1.5, 1 - erf(x) is close to 2 (no cancellation); exp(x²) overflows to inf
    # below about -9.4, as eager's result does.
    return torch.where(x >= _TAIL_FROM, _erfcx_tail(x), torch.exp(x * x) * (1 - torch.erf(x)))


_ERFINV_A = (0.886226899, -1.645349621, 0.914624893, -0.140543331)
_ERFINV_B = (-2.118377725, 1.442710462, -0.329097515, 0.012229801)
_ERFINV_C = (-1.970840454, -1.624906493, 3.429567803, 1.641345311)
_ERFINV_D = (3.543889200, 1.637067800)
_2_SQRT_PI = 2 / math.sqrt(math.pi)


def _erfinv(y: torch.Tensor) -> torch.Tensor:
    """ATen's calc_erfinv: a rational first guess (central below 0.7), then two Newton
    steps on erf (on erfc beyond 0.7); ±inf at ±1, NaN beyond."""
    a, b, c, d = _ERFINV_A, _ERFINV_B, _ERFINV_C, _ERFINV_D
    magnitude = torch.abs(y)
    z = y * y
    central = y * (((a[3] * z + a[2]) * z + a[1]) * z + a[0]) / ((((b[3] * z + b[2]) * z + b[1]) * z + b[0]) * z + 1)
    w = torch.sqrt(-torch.log((1 - torch.clamp_max(magnitude, 1)) / 2))
    numerator = ((c[3] * w + c[2]) * w + c[1]) * w + c[0]
    outer = torch.where(y < 0, -numerator, numerator) / ((d[1] * w + d[0]) * w + 1)
    x = torch.where(magnitude <= 0.7, central, outer)
    for _ in range(2):
        # Beyond 0.7, erf(x) - y as (1 - |y|) - erfc(|x|), signed: 1 - |y| is exact, where
        # erf(x) - y cancels near ±1 into erf's own error (0.99999982: x off by 0.009
        # with an erf 1.4e-7 from the true one)
        tail = torch.sign(y) * ((1 - magnitude) - _erfc(torch.abs(x)))
        x = x - torch.where(magnitude <= 0.7, torch.erf(x) - y, tail) / (_2_SQRT_PI * torch.exp(-x * x))
    x = torch.where(magnitude == 1, torch.where(y > 0, math.inf, -math.inf) * torch.ones_like(y), x)
    return torch.where(magnitude > 1, torch.full_like(y, math.nan), x)


_SQRT_2 = math.sqrt(2)
_SQRT_2_PI = math.sqrt(2 / math.pi)
_LOG_HALF = math.log(0.5)


def _ndtri(p: torch.Tensor) -> torch.Tensor:
    """Φ⁻¹(p): the lower tail q = min(p, 1 - p) (1 - p is exact above 0.5), Abramowitz
    and Stegun's 26.2.23 as first guess (error below 4.5e-4), then Newton steps on
    log Φ(z) = log ½ + log erfcx(-z/√2) - z²/2, which neither underflows nor cancels
    for subnormal q."""
    upper = p > 0.5
    q = torch.where(upper, 1 - p, p)
    t = torch.sqrt(-2 * torch.log(q))
    z = -(t - (2.515517 + t * (0.802853 + t * 0.010328)) / (1 + t * (1.432788 + t * (0.189269 + t * 0.001308))))
    log_q = torch.log(q)
    for _ in range(3):
        scaled = _erfcx(-z / _SQRT_2)
        log_cdf = _LOG_HALF + torch.log(scaled) - z * z / 2
        z = z - (log_cdf - log_q) * scaled / _SQRT_2_PI  # d/dz log Φ = √(2/π) / erfcx(-z/√2)
    result = torch.where(upper, -z, z)
    result = torch.where(p == 0, torch.full_like(p, -math.inf), result)
    result = torch.where(p == 1, torch.full_like(p, math.inf), result)
    return torch.where((p < 0) | (p > 1) | torch.isnan(p), torch.full_like(p, math.nan), result)


register_decomposition(aten.erfc.default)(in_float32(_erfc))
register_decomposition(aten.special_erfcx.default)(in_float32(_erfcx))
register_decomposition(aten.erfinv.default)(in_float32(_erfinv))
register_decomposition(aten.special_ndtri.default)(in_float32(_ndtri))
