"""Ops that IREE does not lower, compiled through a decomposition: PyTorch's own
(`decomp/pytorch.py`) or tori's formulas; each test compares with eager."""

import math

import torch

from tori.testing import assert_matches_eager


def test_pytorch_decompositions_of_reductions_and_copies():
    def fn(bias, mat, vec, x):
        return torch.addmv(bias, mat, vec, beta=0.5, alpha=2.0), x.cumprod(1), x.narrow_copy(1, 1, 2)

    x = torch.tensor([[1.0, 0.0, 2.0], [math.nan, -1.5, 3.0]])
    assert_matches_eager(fn, torch.randn(4), torch.randn(4, 3), torch.randn(3), x)


def test_batch_norm_with_running_stats_update():
    x, mean, var = torch.randn(4, 3, 5), torch.randn(3), torch.rand(3) + 0.5
    weight, bias = torch.randn(3), torch.randn(3)

    def fn(x, mean, var):
        out = torch.ops.aten._batch_norm_with_update_functional(x, weight, bias, mean, var, 0.1, 1e-5)
        return out[0], out[4], out[5]

    assert_matches_eager(fn, x, mean, var)


EDGES = [0.0, -0.0, 1.0, -2.5, 0.75, 1e-40, -3e38, math.inf, -math.inf, math.nan]


def test_floating_point_ops_from_the_encoding():
    x = torch.tensor(EDGES)
    y = torch.tensor(EDGES[::-1])

    def fn(x, y):
        return torch.hypot(x, y), torch.angle(x), torch.nextafter(x, y), *torch.frexp(x), torch.nextafter(x[0], y[0])

    assert_matches_eager(fn, x, y, rtol=0, atol=0)
    assert_matches_eager(lambda a, b: (torch.hypot(a, b), *torch.frexp(a)), x.half(), y.half())


def test_gamma_family():
    # No subnormals: IREE's float arithmetic treats them as zero (lgamma(1e-40) gives inf).
    x = torch.cat([torch.linspace(-8.75, 8.5, 70), torch.tensor([e for e in EDGES if e != 1e-40]), torch.tensor([-3.0, 2.0])])

    def fn(x):
        return (torch.lgamma(x), torch.digamma(x), torch.polygamma(3, x),
                # at the poles eager gives what its float sin(π·x) leaves (not 0): off them
                torch.polygamma(1, x + 0.125),
                torch.special.zeta(torch.full_like(x, 2.5), x.abs() + 0.5), torch.lgamma(x[:0]))

    assert_matches_eager(fn, x, rtol=1e-5, atol=1e-5)


def test_error_functions():
    x = torch.cat([torch.linspace(-10, 12, 89), torch.tensor([math.inf, -math.inf, math.nan, 0.0])])
    p = torch.cat([torch.linspace(0, 1, 41), torch.tensor([1e-30, 1e-8, 1 - 1e-7, -0.5, 2.0, math.nan])])

    def fn(x, p):
        return (torch.erfc(x), torch.special.erfcx(x), torch.special.log_ndtr(x), torch.special.ndtri(p),
                torch.erfinv(2 * p - 1))

    assert_matches_eager(fn, x, p, rtol=1e-5, atol=1e-5)
    assert_matches_eager(lambda x, p: (torch.erfc(x), torch.erfinv(p)), x.half(), (2 * p - 1).half())


def test_bessel_functions():
    x = torch.cat([torch.linspace(-30, 30, 121), torch.tensor([math.inf, -math.inf, math.nan, 0.0, 5.0, 8.0])])

    def fn(x):
        return (torch.special.bessel_j0(x), torch.special.bessel_j1(x), torch.special.spherical_bessel_j0(x),
                torch.i0(x / 4), torch.special.i0e(x), torch.special.i1(x / 4), torch.special.i1e(x))

    assert_matches_eager(fn, x, rtol=1e-5, atol=1e-5)


def test_distances_and_pooling():
    a, b = torch.randn(2, 4, 3), torch.randn(2, 30, 3)
    rows = torch.randn(5, 3)
    x = torch.randn(2, 3, 7, 6)
    x[0, 0, 1, 1] = math.nan

    def fn(a, b, rows, x):
        return (torch.cdist(a, b), torch.cdist(a, b[:, :5], p=1.5), torch.nn.functional.pdist(rows, p=math.inf),
                torch.dist(a, b[:, :4], p=3), *torch.nn.functional.adaptive_max_pool2d(x, (3, 4), return_indices=True),
                torch.prod(rows[0, 0], 0))

    assert_matches_eager(fn, a, b, rows, x, rtol=1e-5, atol=1e-5)
    big = torch.full((64, 64), 30.0, dtype=torch.float16)
    assert_matches_eager(lambda t: torch.dist(t, -t), big)  # a float16 sum of squares overflows


def test_indexing_ops():
    x, source = torch.randn(5, 4), torch.randn(6, 4)
    index = torch.tensor([0, 4, 4, 1, 0, 2])
    sequence = torch.tensor([-1.0, 0.0, 0.5, 2.0, math.nan])
    values = torch.tensor([[-2.0, 0.0, 0.25], [2.0, math.nan, 3.0]])

    def fn(x, source, index, sequence, values):
        return (x.index_reduce(0, index, source, "amax"), x.index_reduce(0, index, source, "mean", include_self=False),
                torch.put(x, index, source[0, :3].repeat(2)), torch.put(x, index, source[1, :3].repeat(2), accumulate=True),
                torch.searchsorted(sequence, values), torch.searchsorted(sequence, values, right=True),
                torch.histc(x, bins=6), torch.histc(x, bins=4, min=-1, max=1))

    assert_matches_eager(fn, x, source, index, sequence, values)


def test_grid_sample_3d():
    volume, grid = torch.randn(2, 3, 4, 5, 6), torch.rand(2, 3, 4, 2, 3) * 2.6 - 1.3
    volume[0, 0, 0, 0, 0] = math.inf  # outside corners add nothing, not 0 · inf

    def fn(v, g):
        F = torch.nn.functional
        return (F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False),
                F.grid_sample(v, g, mode="nearest", padding_mode="reflection", align_corners=False),
                F.grid_sample(v, g, mode="bilinear", padding_mode="border", align_corners=True))

    assert_matches_eager(fn, volume, grid, rtol=1e-5, atol=1e-5)


def test_antialiased_bilinear_resize():
    x = torch.randn(1, 2, 9, 8)

    def fn(x):
        return (torch.nn.functional.interpolate(x, size=(4, 3), mode="bilinear", antialias=True),
                torch.nn.functional.interpolate(x, size=(13, 5), mode="bilinear", antialias=True, align_corners=True))

    assert_matches_eager(fn, x, rtol=1e-5, atol=1e-5)
