"""FileCheck tests of tori-packed-attention: an attention's exponentials, the batched
matmul that reads them and their row sums become one call of a function that writes
the exponentials packed for a `linalg.batch_mmt4d` (16 queries per tile); other forms,
rows that are not whole tiles, shapes too small and `lanes=0` are left as they are."""

import pytest

PIPELINE = "tori-packed-attention{lanes=16}"


def _attention(lead: str, m: int, k: int, n: int, *, sum_first: bool = False, extra_use: bool = False,
               alpha: int = 1, batch: int | None = None) -> str:
    """sub, exp, expand, view, bmm and sum as tori's attention decomposition writes them,
    for scores [*lead, m, k] and values [batch, k, n]."""
    dims = [int(d) for d in lead.split(",")]
    batch = batch if batch is not None else eval("*".join(lead.split(",")))
    s = f"!torch.vtensor<[{lead},{m},{k}],f32>"
    p = f"!torch.vtensor<[{lead},{m},1],f32>"
    e3 = f"!torch.vtensor<[{batch},{m},{k}],f32>"
    v = f"!torch.vtensor<[{batch},{k},{n}],f32>"
    o = f"!torch.vtensor<[{batch},{m},{n}],f32>"
    sizes = ", ".join(f"%d{i}" for i in range(len(dims)))
    consts = "\n".join(f"          %d{i} = torch.constant.int {d}" for i, d in enumerate(dims))
    total = f"          %t = torch.aten.sum.dim_IntList %e, %dims, %true, %none : {s}, !torch.list<int>, !torch.bool, !torch.none -> {p}"
    matmul = f"""          %x = torch.aten.expand %e, %shape, %false : {s}, !torch.list<int>, !torch.bool -> {s}
          %y = torch.aten.view %x, %flat : {s}, !torch.list<int> -> {e3}
          %o = torch.aten.bmm %y, %arg2 : {e3}, {v} -> {o}"""
    more = f"          %z = torch.aten.neg %e : {s} -> {s}\n" if extra_use else ""
    return f"""
        func.func @attention(%arg0: {s}, %arg1: {p}, %arg2: {v}) -> ({o}, {p}) {{
          %true = torch.constant.bool true
          %false = torch.constant.bool false
          %none = torch.constant.none
          %alpha = torch.constant.int {alpha}
          %minus1 = torch.constant.int -1
          %b = torch.constant.int {batch}
          %m = torch.constant.int {m}
          %k = torch.constant.int {k}
{consts}
          %dims = torch.prim.ListConstruct %minus1 : (!torch.int) -> !torch.list<int>
          %shape = torch.prim.ListConstruct {sizes}, %m, %k : ({", ".join(["!torch.int"] * (len(dims) + 2))}) -> !torch.list<int>
          %flat = torch.prim.ListConstruct %b, %m, %k : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
          %sub = torch.aten.sub.Tensor %arg0, %arg1, %alpha : {s}, {p}, !torch.int -> {s}
          %e = torch.aten.exp %sub : {s} -> {s}
{more}{total if sum_first else matmul}
{matmul if sum_first else total}
          return %o, %t : {o}, {p}
        }}
    """


def test_exponentials_matmul_and_sums_become_one_call(filecheck):
    output = filecheck(_attention("2,6", 208, 197, 64), """
        # CHECK-LABEL: func.func @attention
        # CHECK:         %[[S:.+]] = "torch_c.to_builtin_tensor"(%arg0) : (!torch.vtensor<[2,6,208,197],f32>) -> tensor<2x6x208x197xf32>
        # CHECK:         %[[P:.+]] = "torch_c.to_builtin_tensor"(%arg1)
        # CHECK:         %[[V:.+]] = "torch_c.to_builtin_tensor"(%arg2) : (!torch.vtensor<[12,197,64],f32>) -> tensor<12x197x64xf32>
        # CHECK:         %[[C:.+]]:2 = call @tori_packed_attention_2x6x208x197x64_16(%[[S]], %[[P]], %[[V]])
        # CHECK-SAME:      -> (tensor<12x208x64xf32>, tensor<2x6x208x1xf32>)
        # CHECK:         %[[O:.+]] = "torch_c.from_builtin_tensor"(%[[C]]#0)
        # CHECK:         %[[T:.+]] = "torch_c.from_builtin_tensor"(%[[C]]#1)
        # CHECK-NOT:     torch.aten.exp
        # CHECK-NOT:     torch.aten.bmm
        # CHECK:         return %[[O]], %[[T]]
        # CHECK-LABEL: func.func private @tori_packed_attention_2x6x208x197x64_16
        # The scores as 156 tiles of 16 query rows.
        # CHECK:         tensor.expand_shape %{{.*}} output_shape [2, 6, 13, 16, 197]
        # CHECK:         tensor.collapse_shape %{{.*}} : tensor<2x6x13x16x197xf32> into tensor<156x16x197xf32>
        # Each tile's exponentials stored along its queries: [tile, key, query].
        # CHECK:         %[[E:.+]] = linalg.generic {{.*}} ins(%{{.*}}, %{{.*}} : tensor<156x16x197xf32>, tensor<156x16xf32>)
        # CHECK-SAME:      outs(%{{.*}} : tensor<156x197x16xf32>)
        # CHECK:           arith.subf
        # CHECK:           math.exp
        # The row sums over the keys of the packed exponentials.
        # CHECK:         linalg.reduce ins(%[[E]] : tensor<156x197x16xf32>) outs(%{{.*}} : tensor<156x16xf32>) dimensions = [1]
        # CHECK:         tensor.expand_shape %[[E]] {{\\[\\[}}0, 1], [2], [3, 4]] output_shape [12, 13, 197, 16, 1]
        # CHECK:         linalg.pack %{{.*}} outer_dims_perm = [0, 2, 1] inner_dims_pos = [2, 1] inner_tiles = [16, 1] {{.*}} : tensor<12x197x64xf32> -> tensor<12x4x197x16x1xf32>
        # CHECK:         linalg.batch_mmt4d ins(%{{.*}}, %{{.*}} : tensor<12x13x197x16x1xf32>, tensor<12x4x197x16x1xf32>) outs(%{{.*}} : tensor<12x13x4x16x16xf32>)
        # CHECK:         linalg.unpack %{{.*}} inner_dims_pos = [1, 2] inner_tiles = [16, 16] {{.*}} -> tensor<12x208x64xf32>
    """)
    assert "torch.aten.sum.dim_IntList" not in output and "torch.aten.sub.Tensor" not in output
    assert "affine_map<(d0, d1, d2) -> (d0, d2, d1)>" in output  # the scores read across their rows


def test_values_of_other_widths_are_padded_to_whole_tiles(filecheck):
    filecheck(_attention("4", 128, 96, 40), """
        # CHECK: call @tori_packed_attention_4x128x96x40_16
        # CHECK: linalg.pack %{{.*}} padding_value(%{{.*}} : f32) {{.*}} : tensor<4x96x40xf32> -> tensor<4x3x96x16x1xf32>
        # CHECK: linalg.unpack {{.*}} -> tensor<4x128x40xf32>
    """)


def test_exponentials_read_by_two_matmuls_are_left_as_they_are(filecheck):
    source = _attention("2,6", 64, 64, 32)
    twice = source.replace("return %o, %t", "%o2 = torch.aten.bmm %y, %arg2 : !torch.vtensor<[12,64,64],f32>, "
                                           "!torch.vtensor<[12,64,32],f32> -> !torch.vtensor<[12,64,32],f32>\n"
                                           "          return %o, %t")
    # The view read by a second matmul: the exponentials are not the first one's alone.
    output = filecheck(twice, """
        # CHECK-NOT: call @tori_packed_attention
        # CHECK: torch.aten.exp
    """)
    assert "torch.aten.bmm" in output


@pytest.mark.parametrize("source", [
    pytest.param(_attention("2,6", 197, 197, 64), id="rows not whole tiles"),
    pytest.param(_attention("2,6", 48, 197, 64), id="fewer rows than MIN_ROWS"),
    pytest.param(_attention("2,6", 64, 32, 64), id="fewer keys than MIN_KEYS"),
    pytest.param(_attention("2,6", 64, 64, 64, sum_first=True), id="sums before the matmul"),
    pytest.param(_attention("2,6", 64, 64, 64, extra_use=True), id="exponentials used elsewhere"),
    pytest.param(_attention("2,6", 64, 64, 64, alpha=2), id="sub with alpha"),
])
def test_other_forms_are_left_as_they_are(filecheck, source):
    output = filecheck(source, """
        # CHECK-LABEL: func.func @attention
        # CHECK:         torch.aten.exp
        # CHECK:         torch.aten.bmm
        # CHECK-NOT:     func.call
    """)
    assert "tori_packed_attention" not in output


def test_no_lanes_changes_nothing(filecheck):
    output = filecheck(_attention("2,6", 208, 197, 64), """
        # CHECK: torch.aten.exp
        # CHECK: torch.aten.bmm
        # CHECK: torch.aten.sum.dim_IntList
    """, pipeline="tori-packed-attention{lanes=0}")
    assert "tori_packed_attention" not in output
