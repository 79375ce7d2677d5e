"""Bessel functions J0, J1, the spherical j0 and the modified I0, I1 (also scaled by
e^-|x|) of aten.i0 and torch.special, which IREE does not lower: ATen's CPU kernels'
formulas, with the Cephes coefficients and helpers of `special`. Half precision
computes in float32 and rounds, as eager's kernels do."""

from __future__ import annotations

import torch

from tori.frontend.decomp.special import (
    _3PI_4, _I0_A, _I0_B, _I1_A, _I1_B, _J0_PP, _J0_PQ, _J0_QP, _J0_QQ, _J1_PP, _J1_PQ, _J1_QP, _J1_QQ, _PI_4,
    _bessel_j0_small, _bessel_j1_small, _chbevl, _hankel, _modified_i0, _modified_i1)
from tori.frontend.decomp.floating import in_float32
from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


def _j0(x: torch.Tensor) -> torch.Tensor:
    a = torch.abs(x)
    large = _hankel(a, 25.0 / (a * a), _PI_4, (_J0_PP, _J0_PQ, _J0_QP, _J0_QQ), y=False)
    return torch.where(a <= 5.0, _bessel_j0_small(a), large)


def _j1(x: torch.Tensor) -> torch.Tensor:
    a = torch.abs(x)
    large = _hankel(a, 25.0 / (a * a), _3PI_4, (_J1_PP, _J1_PQ, _J1_QP, _J1_QQ), y=False)
    magnitude = torch.where(a <= 5.0, _bessel_j1_small(a), large)
    return torch.where(x < 0, -magnitude, magnitude)


def _spherical_j0(x: torch.Tensor) -> torch.Tensor:
    """sin(x)/x, by its Taylor series below 0.5; 0 at ±inf."""
    xx = x * x
    series = 1.0 + xx * (-1.0 / 6.0 + xx * (1.0 / 120.0 + xx * (-1.0 / 5040.0 + xx * (
        1.0 / 362880.0 + xx * (-1.0 / 39916800.0 + xx * (1.0 / 6227020800.0))))))
    result = torch.where(torch.abs(x) < 0.5, series, torch.sin(x) / x)
    return torch.where(torch.isinf(x), torch.zeros_like(x), result)


def _i0e(x: torch.Tensor) -> torch.Tensor:
    a = torch.abs(x)
    return torch.where(a <= 8.0, _chbevl(a / 2.0 - 2.0, _I0_A), _chbevl(32.0 / a - 2.0, _I0_B) / torch.sqrt(a))


def _i1e(x: torch.Tensor) -> torch.Tensor:
    a = torch.abs(x)
    magnitude = torch.where(a <= 8.0, _chbevl(a / 2.0 - 2.0, _I1_A) * a,
                            _chbevl(32.0 / a - 2.0, _I1_B) / torch.sqrt(a))
    return torch.where(x < 0, -magnitude, magnitude)


register_decomposition(aten.special_bessel_j0.default)(in_float32(_j0))
register_decomposition(aten.special_bessel_j1.default)(in_float32(_j1))
register_decomposition(aten.special_spherical_bessel_j0.default)(in_float32(_spherical_j0))
register_decomposition(aten.i0.default)(in_float32(_modified_i0))
register_decomposition(aten.special_i0e.default)(in_float32(_i0e))
register_decomposition(aten.special_i1.default)(in_float32(_modified_i1))
register_decomposition(aten.special_i1e.default)(in_float32(_i1e))
