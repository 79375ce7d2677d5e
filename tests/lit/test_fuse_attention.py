"""FileCheck tests of tori-fuse-attention: attention written out op by op in, one
scaled_dot_product_attention out; and the forms that must stay as they are."""

import pytest

PIPELINE = "tori-fuse-attention"

T4 = "!torch.vtensor<[1,2,4,8],f32>"
S4 = "!torch.vtensor<[1,2,4,4],f32>"


# The safe softmax's test for rows of -inf: against the number, or against a 0-d
# float32 literal (frontend/decomp/comparisons.py), or the scalar_tensor that folds to it.
SAFE_COMPARISONS = {
    "number": "%eq = torch.aten.eq.Scalar {scores}, %ninf : {S4}, !torch.float -> !torch.vtensor<[1,2,4,4],i1>",
    "literal": "%lit = torch.vtensor.literal(dense<0xFF800000> : tensor<f32>) : !torch.vtensor<[],f32>\n"
               "          %eq = torch.aten.eq.Tensor {scores}, %lit : {S4}, !torch.vtensor<[],f32> -> "
               "!torch.vtensor<[1,2,4,4],i1>",
    "scalar_tensor": "%int6 = torch.constant.int 6\n"
                     "          %st = torch.aten.scalar_tensor %ninf, %int6, %none, %none, %none : !torch.float, "
                     "!torch.int, !torch.none, !torch.none, !torch.none -> !torch.vtensor<[],f32>\n"
                     "          %eq = torch.aten.eq.Tensor {scores}, %st : {S4}, !torch.vtensor<[],f32> -> "
                     "!torch.vtensor<[1,2,4,4],i1>",
}


def attention(mask: str = "", softmax_dim: str = "%int-1", safe: bool | str = False, args: str = "",
              scale: str = "torch.aten.div.Scalar %qk4, %float2 : {S4}, !torch.float -> {S4}",
              extra_results: str = "", extra_types: str = "") -> str:
    """q @ k^T / 2, an optional mask, softmax, @ v: as AOTAutograd writes a
    hand-written attention out, q/k/v of shape [1,2,4,8]."""
    probs = "%p"
    safe_ops = ""
    scores = "%masked" if mask else "%scaled"
    if safe:
        probs = "%safe"
        safe_ops = f"""
          %ninf = torch.constant.float 0xFFF0000000000000
          {SAFE_COMPARISONS["number" if safe is True else safe].format(scores=scores, S4=S4)}
          %all = torch.aten.all.dim %eq, %int-1, %true : !torch.vtensor<[1,2,4,4],i1>, !torch.int, !torch.bool -> !torch.vtensor<[1,2,4,1],i1>
          %zeros = torch.aten.full_like %p, %int0, %none, %none, %none, %false, %none : {S4}, !torch.int, !torch.none, !torch.none, !torch.none, !torch.bool, !torch.none -> {S4}
          %safe = torch.aten.where.self %all, %zeros, %p : !torch.vtensor<[1,2,4,1],i1>, {S4}, {S4} -> {S4}"""
    return f"""
        func.func @attn(%q: {T4}, %k: {T4}, %v: {T4}{args}) -> ({T4}{extra_types}) {{
          %none = torch.constant.none
          %int0 = torch.constant.int 0
          %int1 = torch.constant.int 1
          %int2 = torch.constant.int 2
          %int3 = torch.constant.int 3
          %int4 = torch.constant.int 4
          %int8 = torch.constant.int 8
          %int-1 = torch.constant.int -1
          %float2 = torch.constant.float 2.0
          %false = torch.constant.bool false
          %true = torch.constant.bool true
          %perm = torch.prim.ListConstruct %int0, %int1, %int3, %int2 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
          %kt = torch.aten.permute %k, %perm : {T4}, !torch.list<int> -> !torch.vtensor<[1,2,8,4],f32>
          %sq = torch.prim.ListConstruct %int2, %int4, %int8 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
          %q3 = torch.aten.view %q, %sq : {T4}, !torch.list<int> -> !torch.vtensor<[2,4,8],f32>
          %sk = torch.prim.ListConstruct %int2, %int8, %int4 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
          %k3 = torch.aten.view %kt, %sk : !torch.vtensor<[1,2,8,4],f32>, !torch.list<int> -> !torch.vtensor<[2,8,4],f32>
          %qk = torch.aten.bmm %q3, %k3 : !torch.vtensor<[2,4,8],f32>, !torch.vtensor<[2,8,4],f32> -> !torch.vtensor<[2,4,4],f32>
          %s4 = torch.prim.ListConstruct %int1, %int2, %int4, %int4 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
          %qk4 = torch.aten.view %qk, %s4 : !torch.vtensor<[2,4,4],f32>, !torch.list<int> -> {S4}
          %scaled = {scale.format(S4=S4)}
          {mask}
          %p = torch.aten._softmax {scores}, {softmax_dim}, %false : {S4}, !torch.int, !torch.bool -> {S4}{safe_ops}
          %sp = torch.prim.ListConstruct %int2, %int4, %int4 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
          %p3 = torch.aten.view {probs}, %sp : {S4}, !torch.list<int> -> !torch.vtensor<[2,4,4],f32>
          %v3 = torch.aten.view %v, %sq : {T4}, !torch.list<int> -> !torch.vtensor<[2,4,8],f32>
          %o = torch.aten.bmm %p3, %v3 : !torch.vtensor<[2,4,4],f32>, !torch.vtensor<[2,4,8],f32> -> !torch.vtensor<[2,4,8],f32>
          %so = torch.prim.ListConstruct %int1, %int2, %int4, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
          %o4 = torch.aten.view %o, %so : !torch.vtensor<[2,4,8],f32>, !torch.list<int> -> {T4}
          return %o4{extra_results} : {T4}{extra_types}
        }}
    """


def test_unmasked_attention_becomes_sdpa_with_the_scale(filecheck):
    filecheck(attention(), """
        # CHECK-LABEL: func.func @attn
        # CHECK-NOT:     torch.aten.bmm
        # CHECK:         %[[SCALE:.+]] = torch.constant.float 5.000000e-01
        # CHECK:         %[[O:.+]] = torch.aten.scaled_dot_product_attention %arg0, %arg1, %arg2, %{{.+}}, %{{.+}}, %{{.+}}, %[[SCALE]], %{{.+}} : {{.*}}, !torch.none, !torch.float
        # CHECK-NOT:     torch.aten._softmax
        # CHECK:         return %[[O]]
    """)


def test_scales_on_q_and_k_multiply_into_one_scale(filecheck):
    # SDPA's decomposition scales q and k each by sqrt(scale).
    source = attention(scale="torch.aten.mul.Scalar %qk4, %float2 : {S4}, !torch.float -> {S4}")
    source = source.replace("%q3 = torch.aten.view %q,", "%qs = torch.aten.mul.Scalar %q, %float2 : "
                            f"{T4}, !torch.float -> {T4}\n          %q3 = torch.aten.view %qs,")
    filecheck(source, """
        # CHECK:     %[[SCALE:.+]] = torch.constant.float 4.000000e+00
        # CHECK:     torch.aten.scaled_dot_product_attention %arg0, %arg1, %arg2, %{{.+}}, %{{.+}}, %{{.+}}, %[[SCALE]]
        # CHECK-NOT: torch.aten.mul.Scalar
    """)


def test_additive_mask_is_passed_to_sdpa_at_rank_4(filecheck):
    mask = f"%masked = torch.aten.add.Tensor %scaled, %m, %int1 : {S4}, !torch.vtensor<[4,4],f32>, !torch.int -> {S4}"
    filecheck(attention(mask=mask, args=", %m: !torch.vtensor<[4,4],f32>"), """
        # CHECK:     %[[M4:.+]] = torch.aten.view %arg3, %{{.+}} : !torch.vtensor<[4,4],f32>, !torch.list<int> -> !torch.vtensor<[1,1,4,4],f32>
        # CHECK:     torch.aten.scaled_dot_product_attention %arg0, %arg1, %arg2, %[[M4]],
        # CHECK-NOT: torch.aten.add.Tensor
    """)


def test_masked_fill_with_minus_inf_becomes_a_negated_boolean_mask(filecheck):
    mask = ("%ninf_t = torch.vtensor.literal(dense<0xFF800000> : tensor<f32>) : !torch.vtensor<[],f32>\n"
            f"          %masked = torch.aten.where.self %m, %ninf_t, %scaled : !torch.vtensor<[1,2,4,4],i1>, "
            f"!torch.vtensor<[],f32>, {S4} -> {S4}")
    filecheck(attention(mask=mask, args=", %m: !torch.vtensor<[1,2,4,4],i1>"), """
        # CHECK:     %[[KEEP:.+]] = torch.aten.logical_not %arg3 : !torch.vtensor<[1,2,4,4],i1> -> !torch.vtensor<[1,2,4,4],i1>
        # CHECK:     torch.aten.scaled_dot_product_attention %arg0, %arg1, %arg2, %[[KEEP]],
        # CHECK-NOT: torch.aten.where.self
    """)


@pytest.mark.parametrize("comparison", SAFE_COMPARISONS)
def test_safe_softmax_without_a_mask_is_fused(filecheck, comparison):
    filecheck(attention(safe=comparison), """
        # CHECK:     torch.aten.scaled_dot_product_attention
        # CHECK-NOT: torch.aten.all.dim
        # CHECK-NOT: torch.aten.where.self
    """)


def test_safe_softmax_with_a_runtime_mask_stays(filecheck):
    # A runtime mask may remove a whole row, which safe softmax turns to zeros and
    # IREE's attention kernel would not.
    mask = f"%masked = torch.aten.add.Tensor %scaled, %m, %int1 : {S4}, {S4}, !torch.int -> {S4}"
    filecheck(attention(mask=mask, safe=True, args=f", %m: {S4}"), """
        # CHECK-NOT: torch.aten.scaled_dot_product_attention
        # CHECK:     torch.aten._softmax
    """)


def test_safe_softmax_with_a_literal_causal_mask_is_fused(filecheck):
    mask = ("%cm = torch.vtensor.literal(dense<[[0.0, 0xFF800000, 0xFF800000, 0xFF800000], [0.0, 0.0, 0xFF800000, 0xFF800000], "
            "[0.0, 0.0, 0.0, 0xFF800000], [0.0, 0.0, 0.0, 0.0]]> : tensor<4x4xf32>) : !torch.vtensor<[4,4],f32>\n"
            f"          %masked = torch.aten.add.Tensor %scaled, %cm, %int1 : {S4}, !torch.vtensor<[4,4],f32>, !torch.int -> {S4}")
    filecheck(attention(mask=mask, safe=True), """
        # CHECK: torch.aten.scaled_dot_product_attention
    """)


def test_safe_softmax_with_a_literal_mask_removing_a_row_stays(filecheck):
    row = "0xFF800000, 0xFF800000, 0xFF800000, 0xFF800000"
    mask = (f"%cm = torch.vtensor.literal(dense<[[0.0, 0.0, 0.0, 0.0], [{row}], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]> "
            ": tensor<4x4xf32>) : !torch.vtensor<[4,4],f32>\n"
            f"          %masked = torch.aten.add.Tensor %scaled, %cm, %int1 : {S4}, !torch.vtensor<[4,4],f32>, !torch.int -> {S4}")
    filecheck(attention(mask=mask, safe=True), """
        # CHECK-NOT: torch.aten.scaled_dot_product_attention
    """)


def test_softmax_over_another_dim_stays(filecheck):
    filecheck(attention(softmax_dim="%int2"), """
        # CHECK-NOT: torch.aten.scaled_dot_product_attention
        # CHECK:     torch.aten._softmax
        # CHECK:     torch.aten.bmm
    """)


def test_scores_used_elsewhere_stay(filecheck):
    filecheck(attention(extra_results=", %p", extra_types=f", {S4}"), """
        # CHECK-NOT: torch.aten.scaled_dot_product_attention
        # CHECK:     torch.aten.bmm
        # CHECK:     torch.aten._softmax
    """)


def test_masked_fill_with_a_finite_value_stays(filecheck):
    mask = ("%big = torch.vtensor.literal(dense<-1.0e+09> : tensor<f32>) : !torch.vtensor<[],f32>\n"
            f"          %masked = torch.aten.where.self %m, %big, %scaled : !torch.vtensor<[1,2,4,4],i1>, "
            f"!torch.vtensor<[],f32>, {S4} -> {S4}")
    filecheck(attention(mask=mask, args=", %m: !torch.vtensor<[1,2,4,4],i1>"), """
        # CHECK-NOT: torch.aten.scaled_dot_product_attention
    """)
