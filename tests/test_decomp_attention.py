"""scaled_dot_product_attention on the CPU (tori/frontend/decomp/attention.py): two
matmuls around an unnormalized softmax, the row sums applied to the output; compared
with eager's fused kernel over masks, causal attention, shared key/value heads, fully
masked rows, its logsumexp and its gradients; and `_softmax` over long rows as its three
steps (tori/frontend/decomp/softmax.py)."""

import math
import re

import pytest
import torch
import torch.nn.functional as F

import tori
from tori.testing import assert_matches_eager, count_graphs

aten = torch.ops.aten


def _randn(*shape):
    return torch.randn(*shape)


def _bool_mask(*shape, masked_row=None):
    mask = torch.rand(*shape) > 0.4
    mask[..., 0] = True  # every row attends somewhere unless masked_row says otherwise
    if masked_row is not None:
        mask[..., masked_row, :] = False
    return mask


def _float_mask(*shape, masked_row=None):
    mask = torch.randn(*shape)
    if masked_row is not None:
        mask[..., masked_row, :] = -math.inf
    return mask


def _assert_gradients_match_eager(loss, *inputs):
    compiled = torch.compile(loss, backend="tori", options={"fallback": "error", "cache": False})
    compiled(*inputs).backward()
    grads = [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    loss(*inputs).backward()
    for got, expected in zip(grads, (t.grad for t in inputs)):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


CASES = {
    # name: (fn of q, k, v[, mask], the extra inputs' factory, query heads, key/value heads, keys)
    "plain": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), None, 4, 4, 6),
    "scale": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3), None, 4, 4, 6),
    "negative scale": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=-0.3), None, 4, 4, 6),
    "causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), None, 4, 4, 5),
    "causal, more keys than queries": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                       None, 4, 4, 9),
    "bool mask, a row fully masked": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                                      lambda: _bool_mask(5, 6, masked_row=2), 4, 4, 6),
    "float mask per batch, a row fully masked": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        lambda: _float_mask(2, 1, 5, 6, masked_row=3), 4, 4, 6),
    "float mask per head": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                            lambda: _float_mask(1, 4, 5, 6), 4, 4, 6),
    "shared heads": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), None, 4, 2, 6),
    "shared heads, causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                             None, 6, 2, 5),
    "shared heads, bool mask per head": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
        lambda: _bool_mask(2, 4, 5, 6), 4, 2, 6),
    "shared heads, float mask per head": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
        lambda: _float_mask(1, 4, 5, 6, masked_row=1), 4, 2, 6),
}


@pytest.mark.parametrize("case", list(CASES))
def test_attention_matches_eager_without_a_softmax_op(case):
    fn, mask, heads, kv_heads, keys = CASES[case]
    q, k, v = _randn(2, heads, 5, 8), _randn(2, kv_heads, keys, 8), _randn(2, kv_heads, keys, 8)
    inputs = (q, k, v) if mask is None else (q, k, v, mask())
    assert_matches_eager(fn, *inputs, rtol=1e-5, atol=2e-5)
    code = tori.last_compile().graphs[0].stages["aten"]
    # The decomposition's ops, not PyTorch's math path (its safe softmax).
    assert "aten.amax.default" in code and "aten.exp.default" in code
    assert "_softmax" not in code and "aten.all" not in code


def _lanes() -> int:
    from tori.config import Options
    from tori.targets.codegen import packed_attention_lanes

    return packed_attention_lanes(Options())


def test_exponentials_are_packed_where_they_are_computed():
    # Where tori packs attention (AVX-512), the exponentials are written packed by
    # tori-packed-attention's function. Elsewhere their row sums come out of the second
    # matmul (a column of ones appended to v), so the exponentials' one use is that
    # matmul: IREE packs them in the dispatch that computes them, with no packing
    # dispatch of its own for the 12x197x197 weights.
    q, k, v = _randn(2, 6, 197, 64), _randn(2, 6, 197, 64), _randn(2, 6, 197, 64)
    assert_matches_eager(F.scaled_dot_product_attention, q, k, v, options={"cache": False}, rtol=1e-5, atol=2e-5)
    graph = tori.last_compile().graphs[0]
    vmfb = graph.stages["vmfb"]
    if _lanes():
        assert b"tori_packed_attention_2x6x208x197x64_16" in graph.iree_bytecode
        assert b"batch_mmt4d_12x13x4x197x16x16x1" in vmfb and b"encode_12x208x197" not in vmfb
    else:
        assert "aten.sum" not in graph.stages["aten"]
        assert b"batch_matmul_12x197x65x197" in vmfb and b"encode_12x197x197" not in vmfb


def test_packed_exponentials_get_their_vector_tiles():
    # IREE's tuning spec gives the exponentials' op 16 queries by 16 keys a vector tile
    # where IREE configures the dispatch (IREE's own tile stored each value alone).
    if not _lanes():
        pytest.skip("tori packs attention for CPUs with AVX-512; this one has none")
    from tori.targets.iree_compile import IreeInvocation, run_iree_compile

    q, k, v = _randn(2, 6, 197, 64), _randn(2, 6, 197, 64), _randn(2, 6, 197, 64)
    assert_matches_eager(F.scaled_dot_product_attention, q, k, v, options={"cache": False}, rtol=1e-4, atol=5e-5)
    graph = tori.last_compile().graphs[0]
    configured = IreeInvocation((*graph.iree_invocation.flags, "--compile-to=executable-configurations"))
    text = run_iree_compile(graph.iree_bytecode, configured, graph="configured", timeout_s=300).decode()
    executables = text.split("hal.executable private @")
    exponentials = [e for e in executables if "elementwise_transpose_156x197x16" in e and "math.exp" in e]
    assert len(exponentials) == 1, "no one dispatch of the packed exponentials"
    assert re.findall(r"vector_common_parallel = (\[[0-9, ]+\])", exponentials[0]) == ["[1, 16, 16]"]


@pytest.mark.parametrize("causal", [False, True])
def test_only_packed_attention_gets_the_tuning_spec(causal):
    # The spec (and the configuration phase on one thread that it needs) only where
    # tori-packed-attention's form is in the graph: a causal attention keeps the old form.
    if not _lanes():
        pytest.skip("tori packs attention for CPUs with AVX-512; this one has none")
    q, k, v = _randn(1, 2, 64, 16), _randn(1, 2, 64, 16), _randn(1, 2, 64, 16)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    assert_matches_eager(fn, q, k, v, options={"cache": False}, rtol=1e-4, atol=5e-5)
    graph = tori.last_compile().graphs[0]
    tuned = any(flag.startswith("--iree-codegen-tuning-spec-path") for flag in graph.iree_invocation.flags)
    assert tuned == (not causal)
    assert (b"tori_packed_attention_" in graph.iree_bytecode) == (not causal)


PACKED = {
    # name: (q, k, v shapes, fn): tori-packed-attention's form where the CPU has AVX-512
    "rows padded to whole tiles": ((2, 6, 197, 64), (2, 6, 197, 64), (2, 6, 197, 64), F.scaled_dot_product_attention),
    "whole tiles, heads of 40": ((2, 4, 128, 40), (2, 4, 96, 40), (2, 4, 96, 40), F.scaled_dot_product_attention),
    "shared heads": ((1, 4, 70, 16), (1, 2, 70, 16), (1, 2, 70, 16),
                     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
    "scale": ((2, 2, 64, 32), (2, 2, 64, 32), (2, 2, 64, 32),
              lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.05)),
}


@pytest.mark.parametrize("case", list(PACKED))
def test_packed_attention_matches_eager(case):
    if not _lanes():
        pytest.skip("tori packs attention for CPUs with AVX-512; this one has none")
    *shapes, fn = PACKED[case]
    q, k, v = (_randn(*shape) * 3 for shape in shapes)  # scores far from zero
    with count_graphs() as count:  # float32 sums over the keys, in another order than eager's
        assert_matches_eager(fn, q, k, v, options={"cache": False}, rtol=1e-4, atol=5e-5)
    assert count.compiled_graphs == 1
    assert b"tori_packed_attention_" in tori.last_compile().graphs[0].iree_bytecode
    if case != "shared heads":  # the flash op's logsumexp too (training saves it for the backward graph)
        assert_matches_eager(lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v),
                             *(t[:, :2] for t in (q, k, v)), options={"cache": False}, rtol=1e-4, atol=5e-5)
        assert b"tori_packed_attention_" in tori.last_compile().graphs[0].iree_bytecode


def test_packed_attention_gradients_match_eager():
    if not _lanes():
        pytest.skip("tori packs attention for CPUs with AVX-512; this one has none")
    q, k, v = (_randn(2, 2, 80, 16).requires_grad_() for _ in range(3))

    def loss(q, k, v):
        return F.scaled_dot_product_attention(q, k, v).square().sum()

    with count_graphs() as count:
        _assert_gradients_match_eager(loss, q, k, v)
    assert count.compiled_graphs == 2  # forward and backward
    forward = next(g for g in tori.last_compile().graphs if g.kind == "forward")
    assert b"tori_packed_attention_2x2x80x80x16_16" in forward.iree_bytecode


def test_decoding_step_attention_keeps_its_row_sums():
    # One query row per head against a cache of 512 positions: appending a column to
    # the values would copy the cache on every step.
    q, k, v = _randn(1, 8, 1, 64), _randn(1, 8, 512, 64), _randn(1, 8, 512, 64)
    assert_matches_eager(F.scaled_dot_product_attention, q, k, v, rtol=1e-5, atol=2e-5)
    code = tori.last_compile().graphs[0].stages["aten"]
    assert "aten.sum" in code and "aten.cat" not in code


@pytest.mark.parametrize("rows", [5, 20])  # row sums by a reduction, and by the second matmul
def test_fused_kernel_op_returns_eager_logsumexp_also_of_fully_masked_rows(rows):
    q, k, v = _randn(2, 4, rows, 8), _randn(2, 4, 7, 8), _randn(2, 4, 7, 8)
    mask = _float_mask(2, 4, rows, 7, masked_row=4)
    out, logsumexp = assert_matches_eager(
        lambda *a: aten._scaled_dot_product_flash_attention_for_cpu(*a[:3], attn_mask=a[3]), q, k, v, mask,
        rtol=1e-5, atol=2e-5)
    assert torch.all(out[:, :, 4] == 0) and torch.all(logsumexp[:, :, 4] == 0)
    assert torch.all(logsumexp[:, :, :4] != 0)
    assert ("aten.cat" in tori.last_compile().graphs[0].stages["aten"]) == (rows >= 16)


@pytest.mark.parametrize("rows", [5, 20])
def test_attention_gradients_match_eager(rows):
    q, k, v = (_randn(2, 4, rows, 8).requires_grad_() for _ in range(3))

    def loss(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum()

    _assert_gradients_match_eager(loss, q, k, v)


@pytest.mark.parametrize("options, softmax", [
    pytest.param({"pipeline": "tori-fold-constants, tori-fuse-attention"}, True, id="fused attention pipeline"),
    pytest.param({}, False, id="default pipeline"),
])
def test_pipeline_that_fuses_attention_keeps_pytorchs_softmax(options, softmax):
    # tori-fuse-attention matches the math path's ops (GPU targets: IREE's fused kernel).
    q, k, v = (_randn(1, 2, 16, 8) for _ in range(3))
    assert_matches_eager(F.scaled_dot_product_attention, q, k, v, options=options, rtol=1e-5, atol=2e-5)
    assert ("_softmax" in tori.last_compile().graphs[0].stages["aten"]) == softmax


def test_half_precision_attention_keeps_pytorchs_decomposition():
    q, k, v = (_randn(1, 2, 6, 8).to(torch.bfloat16) for _ in range(3))
    assert_matches_eager(F.scaled_dot_product_attention, q, k, v, rtol=2e-2, atol=2e-2)
    assert "_softmax" in tori.last_compile().graphs[0].stages["aten"]


@pytest.mark.parametrize("row, decomposed", [(197, True), (64, True), (63, False)])
def test_softmax_over_long_rows_is_its_three_steps(row, decomposed):
    # IREE's `_softmax` computes each exponential twice, with a scalar accumulator per
    # row of 197; the three steps store them once (frontend/decomp/softmax.py).
    x = _randn(3, 5, row)
    x[0, 1] = -math.inf  # a row of -inf is NaN in eager
    x[1, 2, 7] = math.nan
    x[2, 3, 0] = math.inf
    assert_matches_eager(lambda t: torch.softmax(t, -1), x, rtol=1e-5, atol=1e-6)
    code = tori.last_compile().graphs[0].stages["aten"]
    assert ("_softmax" not in code and "aten.amax.default" in code) == decomposed


def test_softmax_over_another_dim_keeps_pytorchs_op():
    assert_matches_eager(lambda t: torch.softmax(t, 1), _randn(2, 80, 3), rtol=1e-5, atol=1e-6)
    assert "_softmax" in tori.last_compile().graphs[0].stages["aten"]


def test_softmax_over_rows_of_dynamic_length_compiles_once():
    compiled = torch.compile(lambda t: torch.softmax(t @ t.T, -1), backend="tori", dynamic=True,
                             options={"fallback": "error"})
    with count_graphs() as count:
        for rows in (8, 300, 40):
            t = _randn(rows, 16)
            torch.testing.assert_close(compiled(t), torch.softmax(t @ t.T, -1), rtol=1e-4, atol=1e-5)
    assert count.compiled_graphs == 1 and count.compiled_calls == 3 and count.fallback_calls == 0
