"""Fractional max pooling, narrow with a tensor start, all/any that IREE's lowering
refuses, and the empty uint8 reserve of batch norm: compiled natively, they match
eager (tori.frontend.decomp.pooling, tori.frontend.tensor_start_narrow,
tori.frontend.decomp.logical_reductions, tori-fold-empty-tensors)."""

import math

import pytest
import torch
import torch.nn.functional as F

import tori
from tori.testing import assert_matches_eager, count_graphs

aten = torch.ops.aten


def _pooled(x, x3, samples, samples3, half, half_samples):
    return (*F.fractional_max_pool2d(x, 2, output_size=(4, 5), return_indices=True, _random_samples=samples),
            *F.fractional_max_pool2d(x[0], (3, 2), output_size=(3, 4), return_indices=True,
                                     _random_samples=samples[:1]),
            *F.fractional_max_pool3d(x3, (2, 3, 2), output_size=(3, 2, 4), return_indices=True,
                                     _random_samples=samples3),
            *F.fractional_max_pool2d(half, (2, 3), output_size=(5, 4), return_indices=True,
                                     _random_samples=half_samples))


def test_fractional_max_pool_matches_eager_values_and_indices():
    # Ties (rounded values) take the first maximum, a NaN wins; windows placed by the
    # samples as ATen computes them, in float16 with float16 rounding.
    torch.manual_seed(0)
    x = (torch.randn(2, 3, 9, 11) * 2).round()
    x[0, 1, 4, 5] = math.nan
    samples = torch.rand(2, 3, 2)
    samples[0, 0] = torch.tensor([0.0, 0.999])
    half_samples = torch.rand(2, 3, 2, dtype=torch.float16)
    half_samples[1, 2] = torch.tensor([0.999, 0.5])
    out = assert_matches_eager(_pooled, x, torch.randn(2, 2, 7, 6, 9), samples, torch.rand(2, 2, 3),
                               x.to(torch.float16), half_samples, rtol=0, atol=0)
    assert out[1].dtype == torch.int64 and out[1].shape == (2, 3, 4, 5) and out[6].dtype == torch.float16


def test_narrow_at_a_tensor_start_all_any_over_a_dim_and_batch_norm_reserve_match_eager():
    # batch norm's reserve is an empty uint8 output: IREE rejects it as a returned literal.
    def fn(x, start, back, scalar, u8, features, weight, bias, mean, var):
        normed = aten._batch_norm_with_update(features, weight, bias, mean, var, 0.1, 1e-5)
        return (torch.narrow(x, 1, start, 3), x.narrow(-1, back, 2), scalar.all(0), scalar.any(-1, keepdim=True),
                u8.all(dim=1), u8.any(dim=0, keepdim=True), (scalar * 0).any(0), *normed, mean, var)

    x = torch.randn(4, 6, 5)
    u8 = torch.tensor([[0, 3, 7], [2, 1, 255]], dtype=torch.uint8)
    out = assert_matches_eager(fn, x, torch.tensor(2), torch.tensor(-2), torch.tensor(-1.5), u8, torch.randn(6, 4, 3),
                               torch.rand(4) + 0.5, torch.randn(4), torch.zeros(4), torch.ones(4), rtol=1e-5, atol=1e-5)
    assert out[4].dtype == torch.uint8 and out[2].dtype == torch.bool
    assert out[10].dtype == torch.uint8 and out[10].shape == (0,)


def test_narrow_at_a_start_computed_in_the_graph_breaks_it_in_dynamo():
    # Dynamo cannot capture narrow at a tensor start that the graph computes (-start):
    # its fake narrow leaves an unbacked symbol behind (PendingUnbackedSymbolNotFound).
    # With fullgraph that is an error before tori sees a graph; without, the narrow
    # runs in eager Python between two compiled graphs.
    def fn(x, start):
        return x.narrow(-1, -start, 2) * 2

    x, start = torch.randn(4, 6, 5), torch.tensor(2)
    with pytest.raises(torch._dynamo.exc.InternalTorchDynamoError, match="PendingUnbackedSymbolNotFound"):
        assert_matches_eager(fn, x, start)
    out = assert_matches_eager(fn, x, start, fullgraph=False)
    torch.testing.assert_close(out, x[..., -2:] * 2)


def test_narrow_at_a_tensor_start_follows_the_start_and_raises_out_of_range_as_eager():
    torch._dynamo.reset()
    x = torch.arange(30.0).reshape(5, 6)
    compiled = torch.compile(lambda x, s: x.narrow(1, s, 2), backend="tori", options={"fallback": "error"})
    with count_graphs() as count:
        for start in (0, 3, 4, -2, -6):
            torch.testing.assert_close(compiled(x, torch.tensor(start)), x.narrow(1, start, 2))
    # Dynamo guards the start's range: one graph for the starts from the front, one from the back.
    assert count.compiled_graphs == 2 and count.fallback_calls == 0 and count.compiled_calls == 5
    with pytest.raises(IndexError, match="start out of range"):
        compiled(x, torch.tensor(9))


def test_the_bool_all_of_safe_softmax_keeps_its_form():
    # tori-fuse-attention matches all.dim over eq(scores, -inf): no decomposition for it.
    from tori.frontend.decomp.logical_reductions import all_any_over_a_dim

    scores = torch.randn(2, 4, 8, 8)
    assert all_any_over_a_dim(aten.all.dim, scores == -math.inf, -1, True) is NotImplemented


@pytest.mark.parametrize("size, kernel, stride, padding, dilation, ceil_mode", [
    (112, 3, 2, 1, 1, False),  # ResNet's stem pool: the last padded column is in no window
    (7, 3, 2, 1, 1, True),     # ceil_mode: a last window past the padding
    (10, 2, 3, 0, 1, True),
    (8, 2, 2, 0, 1, False),    # the width (9) is cropped, the height (8) tiles
    (9, 3, 2, 0, 2, False),    # dilated and ragged: PyTorch's decomposition for both
])
def test_ragged_max_pool_values_come_from_one_pooling_op(size, kernel, stride, padding, dilation, ceil_mode):
    x = torch.randn(2, 3, size, size + 1, generator=torch.Generator().manual_seed(0))
    x[0, 0, 1, 1] = float("nan")
    pool = lambda t: F.max_pool2d(t, kernel, stride, padding, dilation, ceil_mode)  # noqa: E731
    with torch.no_grad():
        assert_matches_eager(pool, x)
    pools = tori.last_compile().graphs[0].stages["torch"].count("torch.aten.max_pool2d")
    assert pools == (0 if dilation > 1 else 1)
    assert_matches_eager(lambda t: F.max_pool2d(t, kernel, stride, padding, dilation, ceil_mode, return_indices=True), x)


@pytest.mark.parametrize("pool, shape", [
    (lambda x: F.max_pool1d(x, 2), (3, 7)), (lambda x: F.avg_pool1d(x, 2), (3, 7)),
    (lambda x: F.max_pool2d(x, 2), (3, 5, 7)), (lambda x: F.avg_pool2d(x, 3, ceil_mode=True), (3, 5, 7)),
    (lambda x: F.max_pool1d(x, 3, 2, return_indices=True), (3, 7)),
], ids=["max_pool1d", "avg_pool1d", "max_pool2d", "avg_pool2d ceil", "max_pool1d indices"])
def test_pooling_of_an_unbatched_input_matches_eager(pool, shape):
    # (C, L) and (C, H, W) inputs: IREE's pooling lowerings wanted a batch dim (found by the fuzzer).
    assert_matches_eager(pool, torch.randn(shape), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape, kwargs", [
    ((4, 4, 3), {"kernel_size": 2}),  # the last element in no window (the fuzzer, CI seed)
    ((2, 3), {"kernel_size": 2}),  # unbatched
    ((2, 3, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ((2, 3, 7), {"kernel_size": 3, "stride": 2, "ceil_mode": True, "count_include_pad": False}),
])
def test_ragged_average_pooling_matches_eager(shape, kwargs):
    # IREE's lowering of avg_pool2d failed to verify where the windows do not tile a dim
    # ("inferred input/output operand #1 has shape's dimension ..."): avg_pool1d and 2d.
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    for fn in (lambda t: F.avg_pool1d(t, **kwargs), lambda t: F.avg_pool2d(torch.stack([t, t * 2], -2), **kwargs)):
        assert_matches_eager(fn, x, options={"fallback": "error"})
        assert_matches_eager(fn, x.half(), options={"fallback": "error"}, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dynamic", [False, True])
def test_max_pooling_of_an_empty_batch(dynamic):
    # PyTorch's decomposition of max_pool's indices reshapes the input with a -1, which
    # no size resolves for no element (the dynamic-shape fuzzer).
    fn = lambda t: F.max_pool1d(t, 3, stride=2, padding=1, return_indices=True)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tori", dynamic=dynamic, options={"fallback": "error"})
    for shape in [(0, 3, 7), (0, 4, 7), (2, 4, 7)]:
        x = torch.randn(shape)
        for a, e in zip(compiled(x), fn(x)):
            assert a.shape == e.shape and a.dtype == e.dtype and torch.equal(a, e)
