"""Ops that failed in iree-compile for plumbing reasons rather than a missing formula:
ops IREE's torch lowering leaves whole (its error named a leftover torch.constant),
reductions of 0-d tensors, empty tensors (iree-compile crashed), libm calls. Each
test compiles with fallback='error' and compares with eager."""

import math

import pytest
import torch

import tori
from tori.testing import assert_matches_eager

SIGNED = torch.tensor([-0.0, 0.0, math.nan, -math.nan, -1.5, 2.0, math.inf, -math.inf])


def _bits(t: torch.Tensor) -> torch.Tensor:
    # Compares -0.0 with 0.0 and the sign of NaNs, which assert_close does not.
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()]) if t.dtype.is_floating_point else t


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_signbit_and_copysign_read_the_sign_bit(dtype):
    x, y = SIGNED.to(dtype), SIGNED.flip(0).to(dtype)

    def signs(a, b, scalar):
        return (torch.signbit(a), torch.copysign(a, b), torch.copysign(b, -0.0), torch.copysign(scalar, b),
                torch.signbit(scalar))

    scalar = torch.tensor(-0.0, dtype=dtype)  # a 0-d operand: IREE crashed on its bitcast
    out = assert_matches_eager(signs, x, y, scalar)
    for got, want in zip(out, signs(x, y, scalar)):
        assert torch.equal(_bits(got), _bits(want))


def test_copysign_of_integers_is_a_float():
    a, b = torch.tensor([1, -2, 3]), torch.tensor([-1, 1, 0])
    assert assert_matches_eager(torch.copysign, a, b).dtype == torch.float32


def test_reductions_of_a_0d_tensor():
    x = torch.tensor(2.5)
    assert_matches_eager(lambda t: (t.amax(), t.amin(0, keepdim=True), t.argmax(), t.argmin(-1),
                                    torch.logsumexp(t, 0)), x)


def test_fmax_fmin_ignore_one_nan():
    a = torch.tensor([1.0, math.nan, math.nan, -2.0, 3.0])
    b = torch.tensor([math.nan, 2.0, math.nan, -3.0, 3.0])
    assert_matches_eager(lambda p, q: (torch.fmax(p, q), torch.fmin(p, q), torch.fmax(p, torch.tensor(0.0))), a, b)


def test_log10_needs_no_libm():
    x = torch.tensor([1e-30, 0.1, 1.0, 10.0, 1000.0, 12345.0, 0.0, -1.0, math.inf, math.nan])
    assert_matches_eager(lambda t, n: (torch.log10(t), torch.log10(n)), x, torch.arange(1, 6))  # integers give floats


def test_diagonal_scatter():
    x = torch.randn(4, 5, 3)
    cases = [(0, (0, 1)), (2, (0, 1)), (-2, (1, 0)), (1, (2, 0))]
    sources = [torch.diagonal(x, offset, *dims).clone().normal_() for offset, dims in cases]
    assert_matches_eager(lambda t, *s: tuple(torch.diagonal_scatter(t, src, offset, *dims)
                                             for src, (offset, dims) in zip(s, cases)), x, *sources)


def test_as_strided_scatter_and_view_copies():
    x, src = torch.randn(3, 3), torch.randn(2, 2)
    assert_matches_eager(lambda t, s: (torch.as_strided_scatter(t, s, (2, 2), (1, 2), 1),
                                       torch.ops.aten.view_copy(t, (9,)), torch.ops.aten.permute_copy(t, (1, 0)),
                                       torch.ops.aten.unbind_copy(t, 1)), x, src)


def test_new_empty_strided_has_the_size_and_dtype():
    # An empty tensor's values are undefined: each is filled or reduced and returned,
    # so that Dynamo keeps the calls (unused, it removes them as dead code).
    def fn(t):
        half = t.new_empty_strided((2, 3), (1, 2), dtype=torch.float16).fill_(1.5)
        none = t.new_empty_strided((2, 0, 3), (1, 2, 3))
        return half * t.half(), none, none.sum(1) + t[:1]

    out = assert_matches_eager(fn, torch.randn(3))
    assert [o.dtype for o in out] == [torch.float16, torch.float32, torch.float32]
    assert [tuple(o.shape) for o in out] == [(2, 3), (2, 0, 3), (2, 3)]
    assert tori.last_compile().stages["dynamo"].count(".new_empty_strided(") == 2


def test_block_diagonal_of_dynamic_shapes_runs():
    # block_diag pads each block with (n, 0) zeros: PyTorch's strides for them, (1, 1),
    # differ from Torch-MLIR's default (0, 1), and with n symbolic its lowering compiled
    # the comparison into a check that failed on every call ("not all strides are default").
    def fn(x, w):
        return torch.block_diag(w, w) @ x, torch.cat([x, x.new_zeros(x.shape[0], 0)], 1) * 2

    assert_matches_eager(fn, torch.randn(6, 4), torch.randn(3, 3), dynamic=True)
    assert "torch.SymInt" in tori.last_compile().dynamo_code  # the shapes stayed symbolic


def test_empty_tensors_compile():
    # iree-compile crashed (SIGFPE) on each of these; the empty values are now literals, folded away.
    def ops(a, b, c, d, e, f, g):
        return (a @ torch.ones(5, 10), b @ torch.ones(0, 10), torch.reciprocal(c), torch.nn.functional.pixel_shuffle(d, 1),
                torch.nn.functional.unfold(e, 2), f.sum(0), f.amax(1), g * 2)

    shapes = [(0, 5), (5, 0), (1, 0, 3), (1, 0, 1, 1), (0, 1, 5, 5), (0, 3), (4,)]
    assert_matches_eager(ops, *(torch.randn(s) for s in shapes))


def test_nonzero_of_a_0d_tensor():
    # iree-compile crashed (SIGSEGV) on it; a data-dependent size, so one graph per call.
    for value in (0.0, 3.0):
        compiled = torch.compile(torch.nonzero, backend="tori", fullgraph=True, options={"fallback": "error"})
        x = torch.tensor(value)
        out = compiled(x)
        assert out.shape == torch.nonzero(x).shape and out.dtype == torch.int64


def test_embedding_bag_sum_uses_the_per_sample_weights():
    # IREE's own lowering ignored per_sample_weights: a silently wrong sum.
    weight, indices, weights = torch.randn(10, 5), torch.tensor([1, 2, 4, 5, 4, 3, 0]), torch.randn(7)

    def bags(w, i, o, p, last):
        return (torch.nn.functional.embedding_bag(i, w, o, mode="sum", per_sample_weights=p),
                torch.nn.functional.embedding_bag(i, w, last, mode="sum", per_sample_weights=p,
                                                  include_last_offset=True, padding_idx=4))

    assert_matches_eager(bags, weight, indices, torch.tensor([0, 0, 3]), weights, torch.tensor([0, 3, 7]))


def test_take_of_a_0d_index():
    # Torch-MLIR's decomposition read the index as a Python integer (data-dependent).
    x = torch.randn(3, 3)
    assert_matches_eager(lambda t, i, j: (torch.take(t, i), torch.take(t, j)), x, torch.tensor(4), torch.tensor(-2))


def test_avg_pool3d_with_windows_that_do_not_tile():
    # IREE's lowering failed ("inferred ... dimension #0 to be 3, but found 2").
    pool = torch.nn.functional.avg_pool3d

    def pools(a, b):
        return (pool(a, 2), pool(b, 2, stride=1, padding=1, ceil_mode=True, count_include_pad=False),
                pool(b, (2, 3, 4), stride=(1, 2, 2), padding=(0, 1, 2), ceil_mode=True, divisor_override=2),
                pool(b, 3, stride=2, padding=1, ceil_mode=True))

    assert_matches_eager(pools, torch.randn(2, 3, 3, 4, 4), torch.randn(1, 2, 5, 5, 5))


def test_normal_with_tensor_mean_and_std_has_their_moments():
    compiled = torch.compile(lambda m, s: torch.normal(m, s), backend="tori", fullgraph=True,
                             options={"fallback": "error"})
    sample = compiled(torch.full((20000,), 3.0), torch.full((20000,), 2.0))
    assert sample.shape == (20000,) and sample.dtype == torch.float32
    assert abs(sample.mean().item() - 3.0) < 0.1 and abs(sample.std().item() - 2.0) < 0.1


@pytest.mark.parametrize("reduce", ["argmax", "argmin"])
def test_arg_extremum_points_at_the_first_nan_as_eager(reduce):
    nan = float("nan")
    x = torch.tensor([[1.0, nan, 3.0, nan], [2.0, 5.0, 1.0, 0.0], [nan, 1.0, 2.0, 3.0]])
    fn = getattr(torch, reduce)
    for call in (lambda v: fn(v, dim=1), lambda v: fn(v, dim=0, keepdim=True), lambda v: fn(v)):
        torch._dynamo.reset()
        compiled = torch.compile(call, backend="tori", options={"fallback": "error"})
        assert torch.equal(compiled(x), call(x))
