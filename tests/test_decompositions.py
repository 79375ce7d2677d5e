"""tori's own decompositions: each one fixes a wrong or missing lowering, and the
test shows the case that was wrong without it."""

import pytest
import torch

import tori

from tori.frontend.decompositions import decomposition_table
from tori.testing import assert_matches_eager, count_graphs

HALF = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("reduce", [
    pytest.param(lambda x: x.sum(), id="sum"),
    pytest.param(lambda x: x.sum(dim=1), id="sum_dim"),
    pytest.param(lambda x: x.mean(), id="mean"),
    pytest.param(lambda x: x.mean(dim=0, keepdim=True), id="mean_dim"),
    pytest.param(lambda x: x.flatten().cumsum(0), id="cumsum"),
])
def test_half_precision_reductions_accumulate_like_eager(reduce, dtype):
    # 4096 terms: accumulating in float16 itself loses whole units on the total.
    x = torch.rand(64, 64, dtype=dtype)
    assert_matches_eager(reduce, x)


def test_half_precision_sum_trains():
    x = torch.rand(32, 32, dtype=torch.float16, requires_grad=True)
    assert_matches_eager(lambda t: t.sum(dim=1).mean(), x)
    compiled = torch.compile(lambda t: t.sum(dim=1).mean(), backend="tori", options={"fallback": "error"})
    compiled(x).backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 1 / 32))


def test_explicit_accumulation_dtype_is_kept():
    x = torch.rand(64, 64, dtype=torch.float16)
    out = assert_matches_eager(lambda t: t.sum(dtype=torch.float32), x)
    assert out.dtype == torch.float32


def test_tori_entries_extend_torch_mlirs_table():
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    table = decomposition_table()
    assert set(get_decomposition_table()) <= set(table)
    assert torch.ops.aten.sum.dim_IntList in table and torch.ops.aten.gelu.default in table


TRANSFORMER_MASKS = {
    "no_mask": lambda: {},
    "causal": lambda: {"src_mask": torch.nn.Transformer.generate_square_subsequent_mask(5), "is_causal": True},
    "key_padding": lambda: {"src_key_padding_mask": torch.tensor([[False] * 5, [False] * 3 + [True] * 2])},
    "bool_mask": lambda: {"src_mask": torch.rand(5, 5) > 0.7},
}


@pytest.mark.parametrize("mask", list(TRANSFORMER_MASKS))
@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
def test_transformer_encoder_layer_fast_path_compiles(mask, norm_first, activation):
    # In eval mode under no_grad, nn.TransformerEncoderLayer calls one fused kernel
    # (aten._transformer_encoder_layer_fwd) that IREE cannot lower.
    layer = torch.nn.TransformerEncoderLayer(
        32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first, activation=activation).eval()
    kwargs = TRANSFORMER_MASKS[mask]()
    with torch.no_grad():
        assert_matches_eager(lambda x: layer(x, **kwargs), torch.randn(2, 5, 32))
    assert "_transformer_encoder_layer_fwd" not in tori.last_compile().stages["aten"]


def test_multi_head_attention_fast_path_compiles():
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():
        assert_matches_eager(lambda x: mha(x, x, x, need_weights=False)[0], torch.randn(2, 5, 32))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_tensors_to_integer_powers_match_eager_overflow_included(dtype):
    # Torch-MLIR lowers integer pow not at all ("non-floating point dtype"):
    # torch.square of an int64 tensor failed to compile (found by the export fuzzer).
    x = torch.tensor([3, -4, 0, 1, 2**20, -(2**29)], dtype=dtype)
    fn = lambda t: (torch.square(t), t ** 0, t ** 1, t ** 7, torch.pow(t, 12))  # noqa: E731
    torch._dynamo.reset()
    actual = torch.compile(fn, backend="tori", options={"fallback": "error"})(x)
    for a, e in zip(actual, fn(x)):
        assert a.dtype == e.dtype and torch.equal(a, e)


@pytest.mark.parametrize("conv, x_shape, w_shape, stride", [
    (torch.nn.functional.conv1d, (2, 2, 5), (3, 2, 1), 2),  # a size-1 kernel padded by 1
    (torch.nn.functional.conv2d, (1, 2, 1, 4), (2, 2, 1, 2), 1),  # one row, padding 1 in it
])
def test_gradients_of_a_convolution_padded_beyond_its_kernel(conv, x_shape, w_shape, stride):
    # The input gradient's transposed convolution would need negative padding, which
    # Torch-MLIR's convolution_backward does not lower (found by the gradient fuzzer).
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(x_shape, generator=generator), torch.randn(w_shape, generator=generator)
    b = torch.randn(w_shape[0], generator=generator)
    fn = lambda x, w, b: conv(x, w, b, stride=stride, padding=1)  # noqa: E731
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    expected = torch.autograd.grad((fn(*leaves) ** 2).sum(), leaves)
    torch._dynamo.reset()
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    with count_graphs() as count:
        out = torch.compile(fn, backend="tori", options={"fallback": "error"})(*leaves)
        actual = torch.autograd.grad((out ** 2).sum(), leaves)
    assert count.compiled_graphs == 2
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)


def test_views_of_dynamic_tensors_that_do_not_split_their_dims_in_order():
    # Found by the dynamic-shape fuzzer: x.reshape(1, -1) of an [s0, s1] tensor failed
    # every call ("tensor shape dimension 0 mismatch; expected 1 but have 4"); with a
    # slice or an unsqueeze before it, "mismatching contracting dimension".
    fn = lambda x: (x.reshape(1, -1), x.reshape(-1, 1, 2) * 2, x.reshape(2, -1) + 1,  # noqa: E731
                    x[1:].reshape(1, -1) * 3, x.unsqueeze(1).reshape(2, -1) - 1)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tori", dynamic=True, options={"fallback": "error"})
    with count_graphs() as count:
        for shape in [(4, 6), (6, 2), (10, 4)]:
            x = torch.randn(shape)
            for a, e in zip(compiled(x), fn(x)):
                torch.testing.assert_close(a, e)
    assert count.compiled_calls == 3 and count.fallback_calls == 0


def test_a_sum_of_bools_is_their_or():
    # From `make fuzz` (values, seed 1): logical_not(x1 <= x0) + True was False (IREE
    # added the i1 values and kept the low bit); eager's True + True is True.
    fn = lambda a, b: (a + True, a + b, torch.add(a, b, alpha=False), b + a + a)  # noqa: E731
    a, b = torch.tensor([True, False, True, False]), torch.tensor([True, True, False, False])
    torch._dynamo.reset()
    for x, y in zip(torch.compile(fn, backend="tori", options={"fallback": "error"})(a, b), fn(a, b)):
        assert x.dtype == y.dtype == torch.bool and torch.equal(x, y)


def test_integer_negation_and_division_are_exact_for_every_int64():
    # From `make fuzz` (gradients, seed 2): -(-2147483649) was 2147483648 (Torch-MLIR
    # negates integers through float32) and (2**53 + 1) // 3 one off (floor division
    # through float64). The minimum // -1, which traps on x86, wraps as eager's does.
    minimum = -2**63
    x = torch.tensor([-2147483649, 3, 2**53 + 1, -(2**62) - 1, 0, -7, 7, -7, minimum, minimum, 9])
    y = torch.tensor([7, -2, 3, 2**33 + 1, 5, 2, -2, -2, -1, 3, -1])
    fn = lambda x, y: (-x, x // y, x % y, x // 3, x % -3, torch.div(x, y, rounding_mode="floor"),  # noqa: E731
                       x.to(torch.int32) // y.to(torch.int32))
    torch._dynamo.reset()
    for a, e in zip(torch.compile(fn, backend="tori", options={"fallback": "error"})(x, y), fn(x, y)):
        assert a.dtype == e.dtype and torch.equal(a, e), (a, e)
    # Eager's truncating division of the minimum by -1 traps too: against Python's ints.
    torch._dynamo.reset()
    trunc = torch.compile(lambda x, y: (torch.div(x, y, rounding_mode="trunc"), torch.fmod(x, y)), backend="tori",
                          options={"fallback": "error"})(x, y)
    expected = [int(a / b) if abs(a) < 2**52 else -(-a // b) if (a < 0) != (b < 0) else a // b
                for a, b in zip(x.tolist(), y.tolist())]
    expected[8] = minimum
    assert trunc[0].tolist() == expected
    assert trunc[1].tolist() == [a - b * q for a, b, q in zip(x.tolist(), y.tolist(), expected)][:8] + [0, -2, 0]


def test_float_floor_division_and_fmod_have_eager_special_values():
    # From the gradient fuzzer (remainder's backward floor-divides): inf // 3 was inf
    # (eager NaN, Python's semantics), -5 // inf was -0.0 (eager -1), fmod(5, inf) NaN (eager 5),
    # fmod(-3e38, -3e38) +0.0 (eager -0.0: a zero remainder has the dividend's sign).
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([inf, -inf, 5.0, -5.0, inf, 7.5, -0.0, 3.0, -3.0, 0.0, -7.0, 2.5, nan, 4.0, -3e38, -6.0])
    y = torch.tensor([1e-30, 2.0, inf, inf, inf, -2.0, 1.0, 0.0, 0.0, 0.0, 2.0, -0.5, 1.0, nan, -3e38, 3.0])
    fn = lambda x, y: (x // y, torch.div(x, y, rounding_mode="floor"), x.half() // y.half(),  # noqa: E731
                       torch.fmod(x, y), x // 2.5)
    torch._dynamo.reset()
    for a, e in zip(torch.compile(fn, backend="tori", options={"fallback": "error"})(x, y), fn(x, y)):
        torch.testing.assert_close(a, e, equal_nan=True, rtol=0, atol=0)
        assert torch.equal(torch.signbit(a)[~e.isnan()], torch.signbit(e)[~e.isnan()])  # -0.0 too


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_comparisons_with_a_number_cast_it_to_the_tensors_dtype(dtype):
    # float32(0.1) == 0.1 was False and float32(0.1) > 0.1 True: Torch-MLIR compared in
    # float64, where eager casts the number to the tensor's dtype.
    x = torch.tensor([0.1, 0.2, 0.3, 0.7, -0.1, 6.0], dtype=dtype)
    fn = lambda x: (x > 0.1, x == 0.2, x >= 0.3, x != 0.7, x <= 0.1, x < -0.1,  # noqa: E731
                    (x * 10).to(torch.int32) < 2.5, x.bool() == 0.5, torch.nn.functional.threshold(x, 0.2, -1.0))
    for actual, expected in zip(assert_matches_eager(fn, x), fn(x)):
        assert torch.equal(actual, expected)


def test_hardswish_stays_in_float32_through_irees_input_lowering():
    # MobileNetV3's hardswish compared its float32 values widened to float64 with 0.0
    # and 6.0; fused into a data-tiled dispatch those vectors could pass IREE's size
    # limit (with dump_dir set, the network compiled again on the other data-tiling path).
    import subprocess

    from tori.targets.iree_compile import iree_compile_tool

    with torch.no_grad():
        assert_matches_eager(torch.nn.Hardswish(), torch.randn(4, 64), options={"cache": False})
    graph = tori.last_compile().graphs[0]
    flags = [f for f in graph.iree_invocation.flags if f.startswith("--iree-input")]
    lowered = subprocess.run([iree_compile_tool(), "-", *flags, "--compile-to=input"], input=graph.iree_bytecode,
                             capture_output=True, check=True).stdout.decode()
    assert "arith.cmpf" in lowered and "f64" not in lowered, lowered
