"""erf on the CPU as tori's polynomial (passes/erf_polynomial.py), against float64 erf
and eager PyTorch: within 1.5e-7 everywhere, 2.5e-7 relative below |x| = 1, exact at
the special values; GELU, whose erf it mostly is, matches eager."""

import math

import torch

import tori
from tori.testing import assert_matches_eager


def test_erf_is_within_two_ulps_of_float64_erf_and_exact_at_special_values():
    x = torch.cat([torch.linspace(-5, 5, 200001), torch.logspace(-30, 0.6, 20001),
                   -torch.logspace(-30, 0.6, 20001), torch.tensor([math.inf, -math.inf, -0.0, 0.0, 3.8, -3.8])])
    compiled = torch.compile(torch.erf, backend="tori", options={"cache": False, "fallback": "error"})
    y = compiled(x).double()
    assert b"tori_erf_" in tori.last_compile().graphs[0].iree_bytecode
    exact = torch.tensor([math.erf(v) for v in x.double().tolist()], dtype=torch.float64)
    error = (y - exact).abs()
    assert error.max().item() < 1.5e-7
    small = x.abs() < 1
    assert (error[small] / exact[small].abs().clamp_min(1e-38)).max().item() < 2.5e-7
    assert y[-6:-2].tolist() == [1.0, -1.0, 0.0, 0.0] and torch.signbit(y[-4]) and not torch.signbit(y[-3])
    assert torch.isnan(compiled(torch.tensor([math.nan, 1.0])))[0]


def test_gelu_matches_eager():
    torch.manual_seed(0)
    x = torch.randn(64, 197, 96) * 3
    # values up to 13 (a float32 ulp 9.5e-7 above 8); far below zero 1 + erf loses its digits, in eager too
    assert_matches_eager(torch.nn.GELU(), x, options={"cache": False}, rtol=1e-5, atol=2e-6)
    assert b"tori_erf_64x197x96_f32" in tori.last_compile().graphs[0].iree_bytecode
