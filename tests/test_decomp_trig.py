"""sin, cos and tan with tori's argument reduction (frontend/decomp/trig.py): IREE's
own lose accuracy in the thousands and near tan's poles, and its float64 ones do not
link (`undefined symbol: sin`)."""

import math
from fractions import Fraction

import pytest
import torch

from tori.frontend.decomp import trig
from tori.testing import assert_matches_eager


def _all_three(x):
    return torch.sin(x), torch.cos(x), torch.tan(x)


def test_parts_of_half_pi_multiply_exactly_and_add_up():
    for reduction, mantissa in ((trig._FLOAT32, 24), (trig._FLOAT64, 53)):
        *cut, rest = reduction.half_pi
        for part in cut:  # an odd numerator over a power of two: its significant bits
            assert Fraction(part).numerator.bit_length() <= reduction.part_bits
        assert reduction.exact_quadrants == 2 ** (mantissa - reduction.part_bits)
        total = sum(Fraction(p) for p in reduction.half_pi)
        assert abs(total - trig._HALF_PI) < Fraction(1, 2 ** (len(cut) * reduction.part_bits + mantissa - 2))


def test_large_float32_arguments_match_eager():
    # Exact reduction up to 2**16 quadrants (1.03e5); IREE's sin was off by 3.4
    # relative on this range, and by 4e-4 at the fuzzer's 15409.96.
    x = torch.cat([torch.linspace(-1.0e5, 1.0e5, 200_001), torch.tensor([15409.9609375])])
    out = assert_matches_eager(_all_three, x, rtol=1e-5, atol=1e-5)
    assert out[0][-1].item() == pytest.approx(-0.434039, abs=1e-6)


def test_near_zeros_and_poles_relative_accuracy():
    # Floats nearest to multiples of π/2: sin and cos are near zero there, tan near
    # zero or a pole; only an exact reduction keeps their relative error small.
    multiples = torch.arange(-65000, 65001, 3, dtype=torch.float64) * (math.pi / 2)
    x = torch.cat([multiples.to(torch.float32), torch.nextafter(multiples.to(torch.float32), torch.tensor(math.inf))])
    x = x[x != 0]
    expected = [f(x.double()) for f in (torch.sin, torch.cos, torch.tan)]
    out = assert_matches_eager(_all_three, x, rtol=1e-5, atol=1e-5)
    for actual, truth in zip(out, expected):
        torch.testing.assert_close(actual.double(), truth, rtol=1e-6, atol=0)


def test_special_values():
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-30, -1e-30, 1.5707964, -3.1415927, 1e-6])
    sin, cos, tan = assert_matches_eager(_all_three, x, rtol=1e-6, atol=0)
    assert torch.signbit(sin[:2]).tolist() == [False, True]
    assert torch.signbit(tan[:2]).tolist() == [False, True]
    assert cos[2:5].isnan().all()


def test_huge_arguments_stay_finite_and_bounded():
    # Past 2**16 quadrants the reduction is inexact (docs/limitations.md): the
    # result must still be a finite value of the function's range.
    x = torch.tensor([1e8, -3e9, 1e20, 3.4e38, -3.4e38])
    compiled = torch.compile(_all_three, backend="tori", options={"fallback": "error"})
    sin, cos, tan = compiled(x)
    assert sin.isfinite().all() and cos.isfinite().all() and tan.isfinite().all()
    assert (sin.abs() <= 1).all() and (cos.abs() <= 1).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64], ids=str)
def test_half_and_integer_inputs(dtype):
    x = (torch.linspace(-2000, 2000, 4001)).to(dtype)
    out = assert_matches_eager(_all_three, x)
    assert out[0].dtype == (dtype if dtype.is_floating_point else torch.float32)


def test_float64_compiles_and_is_accurate():
    x = torch.cat([torch.linspace(-1e9, 1e9, 100_001, dtype=torch.float64),
                   torch.tensor([0.0, -0.0, math.inf, math.nan, math.pi / 2, 1e-300], dtype=torch.float64)])
    assert_matches_eager(_all_three, x, rtol=1e-12, atol=1e-12)


def test_sin_trains():
    x = torch.linspace(-50, 50, 101, requires_grad=True)
    compiled = torch.compile(lambda t: torch.sin(t).sum(), backend="tori", options={"fallback": "error"})
    compiled(x).backward()
    torch.testing.assert_close(x.grad, torch.cos(x.detach()), rtol=1e-5, atol=1e-5)
