"""FileCheck tests of tori-row-reductions: a layer normalization's mean and mean of
squared differences over the last dimension become one call that sums each row in
float64 lanes, any other mean, sum or maximum of whole rows a call of its lane form
(its lanes reduced apart);
reductions over other dimensions, of short rows, of other dtypes or dynamic shapes
are left as they are."""

import pytest

PIPELINE = "tori-row-reductions"


def _norm(x: str, kept: str, dim: int = -1, square: str = "%2, %2", keepdim: str = "%true", alpha: int = 1) -> str:
    return f"""
          %true = torch.constant.bool true
          %false = torch.constant.bool false
          %none = torch.constant.none
          %dim = torch.constant.int {dim}
          %alpha = torch.constant.int {alpha}
          %eps = torch.constant.float 1.000000e-05
          %dims = torch.prim.ListConstruct %dim : (!torch.int) -> !torch.list<int>
          %1 = torch.aten.mean.dim %arg0, %dims, {keepdim}, %none : {x}, !torch.list<int>, !torch.bool, !torch.none -> {kept}
          %2 = torch.aten.sub.Tensor %arg0, %1, %alpha : {x}, {kept}, !torch.int -> {x}
          %3 = torch.aten.mul.Tensor {square} : {x}, {x} -> {x}
          %4 = torch.aten.mean.dim %3, %dims, {keepdim}, %none : {x}, !torch.list<int>, !torch.bool, !torch.none -> {kept}
          %5 = torch.aten.add.Scalar %4, %eps, %alpha : {kept}, !torch.float, !torch.int -> {kept}
          %6 = torch.aten.rsqrt %5 : {kept} -> {kept}
          %7 = torch.aten.mul.Tensor %2, %6 : {x}, {kept} -> {x}
"""


def test_layer_norm_moments_become_one_call(filecheck):
    x, kept = "!torch.vtensor<[8,197,384],f32>", "!torch.vtensor<[8,197,1],f32>"
    filecheck(f"""
        func.func @norm(%arg0: {x}) -> ({x}, {kept}) {{
          {_norm(x, kept)}
          return %7, %1 : {x}, {kept}
        }}
    """, """
        # CHECK-LABEL: func.func @norm
        # CHECK:         %[[X:.+]] = "torch_c.to_builtin_tensor"(%arg0) : (!torch.vtensor<[8,197,384],f32>) -> tensor<8x197x384xf32>
        # CHECK:         %[[C:.+]]:2 = call @tori_row_moments_8x197x384_f32(%[[X]]) : (tensor<8x197x384xf32>) -> (tensor<8x197x1xf32>, tensor<8x197x1xf32>)
        # CHECK:         %[[M:.+]] = "torch_c.from_builtin_tensor"(%[[C]]#0) : (tensor<8x197x1xf32>) -> !torch.vtensor<[8,197,1],f32>
        # CHECK:         %[[V:.+]] = "torch_c.from_builtin_tensor"(%[[C]]#1) : (tensor<8x197x1xf32>) -> !torch.vtensor<[8,197,1],f32>
        # CHECK-NOT:     torch.aten.mean.dim
        # CHECK:         %[[D:.+]] = torch.aten.sub.Tensor %arg0, %[[M]]
        # CHECK-NOT:     torch.aten.mul.Tensor %[[D]], %[[D]]
        # CHECK:         %[[E:.+]] = torch.aten.add.Scalar %[[V]]
        # CHECK:         return {{.*}}, %[[M]]
        # CHECK-LABEL: func.func private @tori_row_moments_8x197x384_f32
        # CHECK:         tensor.collapse_shape %{{.*}} {{\\[\\[}}0, 1], [2]] : tensor<8x197x384xf32> into tensor<1576x384xf32>
        # CHECK:         tensor.expand_shape %{{.*}} {{\\[\\[}}0], [1, 2]] output_shape [1576, 48, 8] : tensor<1576x384xf32> into tensor<1576x48x8xf32>
        # CHECK:         %[[S:.+]]:2 = linalg.generic
        # CHECK-SAME:      iterator_types = ["parallel", "reduction", "parallel"]
        # CHECK-SAME:      outs({{.*}} : tensor<1576x8xf64>, tensor<1576x8xf64>)
        # CHECK:           arith.extf %{{.*}} : f32 to f64
        # The lanes, each an input of an elementwise op over the rows (no reduction).
        # CHECK:         linalg.generic {{.*}} iterator_types = ["parallel"]
        # CHECK-SAME:      ins(%[[S]]#0, %[[S]]#0, %[[S]]#0, %[[S]]#0, %[[S]]#0, %[[S]]#0, %[[S]]#0, %[[S]]#0, %[[S]]#1,
        # CHECK:           arith.subf
        # CHECK:           arith.maximumf
        # CHECK:           arith.truncf
        # CHECK:         tensor.expand_shape {{.*}} output_shape [8, 197, 1] : tensor<1576xf32> into tensor<8x197x1xf32>
    """)


def test_rows_of_a_matrix_need_no_collapse(filecheck):
    x, kept = "!torch.vtensor<[4,64],f32>", "!torch.vtensor<[4,1],f32>"
    output = filecheck(f"""
        func.func @norm(%arg0: {x}) -> {x} {{
          {_norm(x, kept, dim=1)}
          return %7 : {x}
        }}
    """, """
        # CHECK: call @tori_row_moments_4x64_f32
        # CHECK-LABEL: func.func private @tori_row_moments_4x64_f32
        # CHECK-NOT: tensor.collapse_shape
        # CHECK: output_shape [4, 8, 8]
    """)
    assert "torch.aten.mean.dim" not in output
    assert all(f"affine_map<(d0) -> (d0, {lane})>" in output for lane in range(8))  # each lane an input


def test_one_function_serves_every_normalization_of_its_shape(filecheck):
    x, kept = "!torch.vtensor<[2,64],f32>", "!torch.vtensor<[2,1],f32>"
    output = filecheck(f"""
        func.func @twice(%arg0: {x}) -> ({x}, {x}) {{
          {_norm(x, kept)}
          %11 = torch.aten.mean.dim %7, %dims, %true, %none : {x}, !torch.list<int>, !torch.bool, !torch.none -> {kept}
          %12 = torch.aten.sub.Tensor %7, %11, %alpha : {x}, {kept}, !torch.int -> {x}
          %13 = torch.aten.mul.Tensor %12, %12 : {x}, {x} -> {x}
          %14 = torch.aten.mean.dim %13, %dims, %true, %none : {x}, !torch.list<int>, !torch.bool, !torch.none -> {kept}
          %15 = torch.aten.mul.Tensor %12, %14 : {x}, {kept} -> {x}
          return %7, %15 : {x}, {x}
        }}
    """, """
        # CHECK-COUNT-2: call @tori_row_moments_2x64_f32
    """)
    assert output.count("func.func private @tori_row_moments") == 1
    assert "torch.aten.mean.dim" not in output


def _rms(x: str, kept: str, square: str) -> str:
    return f"""
        func.func @rms(%arg0: {x}) -> {kept} {{
          %true = torch.constant.bool true
          %none = torch.constant.none
          %dim = torch.constant.int 2
          %two = torch.constant.int 2
          %dims = torch.prim.ListConstruct %dim : (!torch.int) -> !torch.list<int>
          {square}
          %1 = torch.aten.mean.dim %0, %dims, %true, %none : {x}, !torch.list<int>, !torch.bool, !torch.none -> {kept}
          %2 = torch.aten.rsqrt %1 : {kept} -> {kept}
          return %2 : {kept}
        }}
    """


@pytest.mark.parametrize("square", ["mul", "pow"])
def test_a_mean_of_squares_squares_in_its_lane_sums(filecheck, square):
    # RMSNorm: mean(x * x) or mean(x ** 2) over the last dimension, then rsqrt. The call
    # reads x: the op that computes x writes no squares beside it.
    x, kept = "!torch.vtensor<[1,128,512],f32>", "!torch.vtensor<[1,128,1],f32>"
    squaring = {"mul": f"%0 = torch.aten.mul.Tensor %arg0, %arg0 : {x}, {x} -> {x}",
                "pow": f"%0 = torch.aten.pow.Tensor_Scalar %arg0, %two : {x}, !torch.int -> {x}"}[square]
    output = filecheck(_rms(x, kept, squaring), """
        # CHECK-LABEL: func.func @rms
        # CHECK-NOT:     torch.aten.mul.Tensor
        # CHECK-NOT:     torch.aten.pow.Tensor_Scalar
        # CHECK:         %[[B:.+]] = "torch_c.to_builtin_tensor"(%arg0)
        # CHECK:         %[[C:.+]] = call @tori_row_mean_square_1x128x512_f32(%[[B]]) : (tensor<1x128x512xf32>) -> tensor<1x128x1xf32>
        # CHECK:         %[[M:.+]] = "torch_c.from_builtin_tensor"(%[[C]])
        # CHECK:         torch.aten.rsqrt %[[M]]
        # CHECK-LABEL: func.func private @tori_row_mean_square_1x128x512_f32
        # CHECK:         %[[S:[0-9]+]] = linalg.generic {{.*}} iterator_types = ["parallel", "reduction", "parallel"]
        # CHECK-SAME:      outs({{.*}} : tensor<128x8xf64>)
        # CHECK:           %[[W:.+]] = arith.extf
        # CHECK-NEXT:      %[[Q:.+]] = arith.mulf %[[W]], %[[W]] : f64
        # CHECK-NEXT:      arith.addf %{{.*}}, %[[Q]] : f64
        # The lanes reduced apart, so that IREE fuses no combine of them into the op
        # that reads the mean.
        # CHECK:         %[[T:.+]] = linalg.generic {{.*}} iterator_types = ["parallel", "reduction"]
        # CHECK-SAME:      ins(%[[S]] : tensor<128x8xf64>) outs({{.*}} : tensor<128xf64>)
        # CHECK:           arith.addf {{.*}} : f64
        # CHECK:         %[[SCALE:.+]] = arith.constant 0.001953125 : f64
        # CHECK:         linalg.generic {{.*}} iterator_types = ["parallel"]
        # CHECK-SAME:      ins(%[[T]] : tensor<128xf64>) outs({{.*}} : tensor<128xf32>)
        # CHECK:           arith.mulf %{{.*}}, %[[SCALE]] : f64
        # CHECK:           arith.truncf
        # CHECK-NOT:     arith.divf
    """)
    assert "torch.aten.mean.dim" not in output


def test_squares_that_other_ops_read_or_other_powers_stay(filecheck):
    x, kept = "!torch.vtensor<[1,128,512],f32>", "!torch.vtensor<[1,128,1],f32>"
    filecheck(_rms(x, kept, f"%0 = torch.aten.pow.Tensor_Scalar %arg0, %dim : {x}, !torch.int -> {x}").replace(
        "%dim = torch.constant.int 2", "%dim = torch.constant.int -1").replace(
        "%two = torch.constant.int 2", "%two = torch.constant.int 3").replace("%arg0, %dim :", "%arg0, %two :"), """
        # CHECK-LABEL: func.func @rms
        # CHECK:         %[[Q:.+]] = torch.aten.pow.Tensor_Scalar %arg0
        # CHECK:         %[[B:.+]] = "torch_c.to_builtin_tensor"(%[[Q]])
        # CHECK:         call @tori_row_mean_1x128x512_f32(%[[B]])
    """)
    shared = f"""
        func.func @shared(%arg0: {x}) -> ({kept}, {x}) {{
          %true = torch.constant.bool true
          %none = torch.constant.none
          %dim = torch.constant.int -1
          %dims = torch.prim.ListConstruct %dim : (!torch.int) -> !torch.list<int>
          %0 = torch.aten.mul.Tensor %arg0, %arg0 : {x}, {x} -> {x}
          %1 = torch.aten.mean.dim %0, %dims, %true, %none : {x}, !torch.list<int>, !torch.bool, !torch.none -> {kept}
          return %1, %0 : {kept}, {x}
        }}
    """
    filecheck(shared, """
        # CHECK-LABEL: func.func @shared
        # CHECK:         %[[Q:.+]] = torch.aten.mul.Tensor %arg0, %arg0
        # CHECK:         %[[B:.+]] = "torch_c.to_builtin_tensor"(%[[Q]])
        # CHECK:         call @tori_row_mean_1x128x512_f32(%[[B]])
    """)


def test_means_of_other_shapes_are_left_as_they_are(filecheck):
    cases = {
        # a row of 16: shorter than MIN_ROW
        "row of 16": ("!torch.vtensor<[4,16],f32>", "!torch.vtensor<[4,1],f32>", {}),
        # over the first dimension
        "first dim": ("!torch.vtensor<[64,64],f32>", "!torch.vtensor<[1,64],f32>", {"dim": 0}),
        "float16": ("!torch.vtensor<[4,64],f16>", "!torch.vtensor<[4,1],f16>", {}),
        "dynamic": ("!torch.vtensor<[?,64],f32>", "!torch.vtensor<[?,1],f32>", {}),
    }
    for case, (x, kept, changes) in cases.items():
        output = filecheck(f"""
            func.func @norm(%arg0: {x}) -> {x} {{
              {_norm(x, kept, **changes)}
              return %7 : {x}
            }}
        """, """
            # CHECK: torch.aten.mean.dim
            # CHECK: torch.aten.mean.dim
            # CHECK-NOT: call @tori_row
        """)
        assert "tori_row" not in output, case


def test_means_of_other_patterns_are_summed_apart(filecheck):
    x, kept = "!torch.vtensor<[4,64],f32>", "!torch.vtensor<[4,1],f32>"
    cases = {
        # the product of two different tensors is no square
        "not a square": ({"square": "%2, %arg0"}, """
            # CHECK-COUNT-2: call @tori_row_mean_4x64_f32
        """),
        # x - 2 * mean: its square's mean is a mean of squares of its own
        "alpha 2": ({"alpha": 2}, """
            # CHECK:         call @tori_row_mean_4x64_f32
            # CHECK:         %[[D:.+]] = torch.aten.sub.Tensor %arg0
            # CHECK:         %[[B:.+]] = "torch_c.to_builtin_tensor"(%[[D]])
            # CHECK:         call @tori_row_mean_square_4x64_f32(%[[B]])
        """),
    }
    for case, (changes, checks) in cases.items():
        output = filecheck(f"""
            func.func @norm(%arg0: {x}) -> {x} {{
              {_norm(x, kept, **changes)}
              return %7 : {x}
            }}
        """, checks)
        assert "tori_row_moments" not in output and "torch.aten.mean.dim" not in output, case


def test_a_square_with_another_use_stays(filecheck):
    x, kept = "!torch.vtensor<[4,64],f32>", "!torch.vtensor<[4,1],f32>"
    output = filecheck(f"""
        func.func @norm(%arg0: {x}) -> ({x}, {x}) {{
          {_norm(x, kept)}
          return %7, %3 : {x}, {x}
        }}
    """, """
        # CHECK:     %[[D:.+]] = torch.aten.sub.Tensor
        # CHECK:     %[[S:.+]] = torch.aten.mul.Tensor %[[D]], %[[D]]
        # CHECK:     call @tori_row_mean_4x64_f32
        # CHECK:     return {{.*}}, %[[S]]
    """)
    assert "@tori_row_moments" not in output


def test_nothing_changes_for_other_targets(filecheck):
    x, kept = "!torch.vtensor<[4,64],f32>", "!torch.vtensor<[4,1],f32>"
    filecheck(f"""
        func.func @norm(%arg0: {x}) -> {x} {{
          {_norm(x, kept)}
          return %7 : {x}
        }}
    """, """
        # CHECK: torch.aten.mean.dim
        # CHECK-NOT: call @tori_row
    """, pipeline="tori-row-reductions{cpu=false}")


def _reduce(op: str, x: str, kept: str) -> str:
    operands, types = ("%dims, %true, %none", "!torch.list<int>, !torch.bool, !torch.none") if op != "torch.aten.amax" \
        else ("%dims, %true", "!torch.list<int>, !torch.bool")
    return f"""
        func.func @rows(%arg0: {x}) -> {kept} {{
          %true = torch.constant.bool true
          %none = torch.constant.none
          %dim = torch.constant.int -1
          %dims = torch.prim.ListConstruct %dim : (!torch.int) -> !torch.list<int>
          %0 = {op} %arg0, {operands} : {x}, {types} -> {kept}
          return %0 : {kept}
        }}
    """


def test_a_row_maximum_takes_sixteen_float32_lanes(filecheck):
    # BERT's attention scores at 8 sequences: rows of 128 keys, 8 vectors of 16 lanes.
    x, kept = "!torch.vtensor<[96,128,128],f32>", "!torch.vtensor<[96,128,1],f32>"
    filecheck(_reduce("torch.aten.amax", x, kept), """
        # CHECK-LABEL: func.func @rows
        # CHECK:         call @tori_row_max_96x128x128_f32
        # CHECK-NOT:     torch.aten.amax
        # CHECK-LABEL: func.func private @tori_row_max_96x128x128_f32
        # CHECK:         %[[LOW:.+]] = arith.constant 0xFF800000 : f32
        # CHECK:         tensor.collapse_shape {{.*}} into tensor<12288x128xf32>
        # CHECK-NOT:     tensor.extract_slice
        # CHECK:         output_shape [12288, 8, 16]
        # CHECK:         linalg.fill ins(%[[LOW]] : f32) outs({{.*}} : tensor<12288x16xf32>)
        # CHECK:         %[[S:[0-9]+]] = linalg.generic {{.*}} iterator_types = ["parallel", "reduction", "parallel"]
        # CHECK:           arith.maximumf
        # The lanes reduced apart: a softmax's exponentials fused an elementwise
        # combine, each value of a row folding its 16 lanes again.
        # CHECK:         %[[M:[0-9]+]] = linalg.generic {{.*}} iterator_types = ["parallel", "reduction"]
        # CHECK-SAME:      ins(%[[S]] : tensor<12288x16xf32>) outs({{.*}} : tensor<12288xf32>)
        # CHECK:           arith.maximumf {{.*}} : f32
        # CHECK-NEXT:      linalg.yield
        # CHECK:         tensor.expand_shape %[[M]]
    """)


def test_a_row_sum_adds_float64_lanes(filecheck):
    x, kept = "!torch.vtensor<[8,128,136],f32>", "!torch.vtensor<[8,128,1],f32>"
    filecheck(_reduce("torch.aten.sum.dim_IntList", x, kept), """
        # CHECK:         call @tori_row_sum_8x128x136_f32
        # CHECK-LABEL: func.func private @tori_row_sum_8x128x136_f32
        # CHECK:         output_shape [1024, 17, 8]
        # CHECK:         arith.extf
        # CHECK:         linalg.generic {{.*}} iterator_types = ["parallel", "reduction"]
        # CHECK-SAME:      outs({{.*}} : tensor<1024xf64>)
        # CHECK:         linalg.generic {{.*}} iterator_types = ["parallel"]
        # CHECK-NOT:       arith.mulf
        # CHECK:           arith.truncf
        # CHECK-NOT:     arith.divf
    """)


def test_rows_that_are_not_whole_vectors_are_left_as_they_are(filecheck):
    # DeiT's 197 keys, 130 values (not 16 nor 8 lanes): their whole vectors would be a
    # slice that IREE copies.
    cases = [("torch.aten.amax", "!torch.vtensor<[48,197,197],f32>", "!torch.vtensor<[48,197,1],f32>"),
             ("torch.aten.amax", "!torch.vtensor<[4,136],f32>", "!torch.vtensor<[4,1],f32>"),
             ("torch.aten.sum.dim_IntList", "!torch.vtensor<[4,130],f32>", "!torch.vtensor<[4,1],f32>"),
             ("torch.aten.mean.dim", "!torch.vtensor<[4,100],f32>", "!torch.vtensor<[4,1],f32>")]
    for op, x, kept in cases:
        output = filecheck(_reduce(op, x, kept), f"""
            # CHECK: {op}
            # CHECK-NOT: call @tori_row
        """)
        assert "tori_row" not in output, (op, x)
