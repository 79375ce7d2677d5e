"""float16 and bfloat16 ops are computed in float32 and rounded once, as eager's CPU
kernels do (tori.frontend.decomp.half_precision)."""

from __future__ import annotations

import pytest
import torch

from tori.testing import count_graphs


def _compiled(fn, *args):
    torch._dynamo.reset()
    with count_graphs() as count:
        result = torch.compile(fn, backend="tori", fullgraph=True, options={"fallback": "error"})(*args)
    assert count.compiled_graphs == 1 and count.compiled_calls == 1 and count.fallback_graphs == 0
    return result


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_pointwise_op_of_several_steps_rounds_once_like_eager(dtype):
    torch.manual_seed(0)
    x, a = torch.randn(4096, dtype=dtype), torch.randn(4096, dtype=dtype)
    fn = lambda x, a: torch.lerp(x, a, 0.3)  # noqa: E731
    assert torch.equal(_compiled(fn, x, a), fn(x, a))


def test_explicit_roundings_are_kept():
    x = torch.randn(256) * 3
    fn = lambda x: x.half().float() * 2  # noqa: E731
    assert torch.equal(_compiled(fn, x), fn(x))


def test_a_norm_whose_squares_overflow_float16_stays_finite():
    x = torch.full((16,), 300.0, dtype=torch.float16)  # 300**2 > float16's largest, 65504
    fn = lambda x: torch.linalg.vector_norm(x)  # noqa: E731
    result = _compiled(fn, x)
    assert torch.isfinite(result) and result.dtype == torch.float16
    torch.testing.assert_close(result, fn(x))


def test_matrix_product_accumulates_in_float32():
    torch.manual_seed(0)
    a, b = torch.randn(8, 512, dtype=torch.float16), torch.randn(512, 8, dtype=torch.float16)
    expected = (a.float() @ b.float()).half()
    torch.testing.assert_close(_compiled(torch.mm, a, b), expected, rtol=1e-3, atol=1e-3)
