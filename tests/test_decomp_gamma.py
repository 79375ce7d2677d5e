"""The regularized incomplete gamma functions, digamma on one element and histogram,
decomposed into torch ops (tori.frontend.decomp.gamma, .histogram): compiled
natively, they match eager over their ranges and at the edges."""

import math

import torch

from tori.testing import assert_matches_eager

EDGES = [0.0, -0.0, 1e-6, 1e-3, 0.5, 1.0, 2.5, 3.5, 9.0, 20.0, math.inf, -math.inf, math.nan, -1.0]


def test_incomplete_gamma_and_one_element_digamma_match_eager():
    # A grid over both formulas (the series below x = a + 1, the continued fraction
    # above, slowest on that boundary) and the special values: a or x zero, infinite,
    # NaN or negative. The 0-d digamma once took iree-compile past 10 GB.
    grid = torch.linspace(0.01, 20, 60)
    a = torch.cat([grid[:, None].expand(60, 60).reshape(-1), torch.tensor(EDGES)[:, None].expand(14, 14).reshape(-1)])
    x = torch.cat([grid[None, :].expand(60, 60).reshape(-1), torch.tensor(EDGES)[None, :].expand(14, 14).reshape(-1)])
    point = torch.tensor(-2.5)
    line = torch.tensor([-8.5, -2.0, -0.0, 0.0, 1e-4, 0.3, 1.0, 9.99, 10.0, 10.5, 123.0, math.inf, -math.inf, math.nan])

    def f(a, x, point, line):
        return torch.igamma(a, x), torch.igammac(a, x), torch.digamma(point), torch.digamma(line)

    out = assert_matches_eager(f, a, x, point, line, rtol=1e-5, atol=1e-5)
    assert out[2].shape == () and torch.isnan(out[0][-1])


def test_histogram_and_half_precision_igamma_match_eager():
    # Integer bins over the data, a given range or an explicit edge tensor; values on
    # the edges (the last edge belongs to the last bin), outside them, weights,
    # density, a 0-d input and all-equal values (eager widens their bin to width 1).
    # igamma in float16 computes in float32 and rounds, as eager does.
    x = torch.cat([torch.arange(-3.0, 4.0), torch.randn(40, generator=torch.Generator().manual_seed(0)) * 2])
    weight = torch.rand(47, generator=torch.Generator().manual_seed(1))
    edges = torch.tensor([-2.0, -0.5, 0.0, 1.0, 2.0])
    a = torch.tensor([0.1, 0.5, 1.0, 2.0, 4.5, 8.0], dtype=torch.float16)[:, None]
    z = torch.tensor([0.0, 0.25, 1.0, 3.0, 8.5, math.inf], dtype=torch.float16)

    def f(x, weight, edges, a, z):
        return (torch.histogram(x, 6), torch.histogram(x, edges), torch.histogram(x, 5, weight=weight, density=True),
                torch.histogram(x, 4, range=(-2.0, 2.0)), torch.histogram(x[0], 3), torch.histogram(x[:1] * 0, 2),
                torch.histogram(x, edges, weight=weight, density=True), torch.igamma(a, z))

    out = assert_matches_eager(f, x, weight, edges, a, z, rtol=1e-5, atol=1e-5)
    assert out[0].hist.sum() == 47 and out[0].hist[-1] > 0
    assert out[7].dtype == torch.float16
