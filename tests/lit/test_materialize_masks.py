"""FileCheck tests of tori-materialize-masks: a float tensor selected by a boolean
argument of the function passes through IREE's optimization barrier before its users;
a `where` of a computed condition, and modules for other targets, are left as they
are."""

PIPELINE = "tori-materialize-masks"

MASK, SCORES = "!torch.vtensor<[1,1,1,19],i1>", "!torch.vtensor<[1,8,1,19],f32>"
BIAS, SCALAR = "!torch.vtensor<[1,1,1,19],f32>", "!torch.vtensor<[],f32>"


def masked(condition: str = "%arg0") -> str:
    compare = (f"%c = torch.aten.gt.Scalar %arg2, %zero : {BIAS}, !torch.int -> {MASK}"
               if condition == "%c" else "")
    return f"""
        func.func @masked(%arg0: {MASK}, %arg1: {SCORES}, %arg2: {BIAS}, %a: {SCALAR}, %b: {SCALAR}) -> {SCORES} {{
          %zero = torch.constant.int 0
          %one = torch.constant.int 1
          {compare}
          %0 = torch.aten.where.self {condition}, %a, %b : {MASK}, {SCALAR}, {SCALAR} -> {BIAS}
          %1 = torch.aten.add.Tensor %arg1, %0, %one : {SCORES}, {BIAS}, !torch.int -> {SCORES}
          return %1 : {SCORES}
        }}
    """


def test_a_bias_selected_by_a_boolean_input_is_kept_behind_the_barrier(filecheck):
    filecheck(masked(), """
        # CHECK-LABEL: func.func @masked
        # CHECK:         %[[W:.+]] = torch.aten.where.self %arg0, %arg3, %arg4
        # CHECK-NEXT:    %[[T:.+]] = "torch_c.to_builtin_tensor"(%[[W]]) : (!torch.vtensor<[1,1,1,19],f32>) -> tensor<1x1x1x19xf32>
        # CHECK-NEXT:    %[[K:.+]] = "util.optimization_barrier"(%[[T]]) : (tensor<1x1x1x19xf32>) -> tensor<1x1x1x19xf32>
        # CHECK-NEXT:    %[[B:.+]] = "torch_c.from_builtin_tensor"(%[[K]]) : (tensor<1x1x1x19xf32>) -> !torch.vtensor<[1,1,1,19],f32>
        # CHECK-NEXT:    torch.aten.add.Tensor %arg1, %[[B]]
    """)


def test_a_computed_condition_and_other_targets_are_left_alone(filecheck):
    filecheck(masked("%c"), """
        # CHECK-LABEL: func.func @masked
        # CHECK-NOT:     util.optimization_barrier
    """)
    filecheck(masked(), """
        # CHECK-LABEL: func.func @masked
        # CHECK-NOT:     util.optimization_barrier
    """, pipeline="tori-materialize-masks{cpu=false}")


def test_a_boolean_constant_is_stored_as_bytes_and_compared_with_zero(filecheck):
    """IREE's data tiling hoisted an i1 constant's encoded copy, and its encoding
    executable failed on the i1 buffer; a splat is left to IREE."""
    filecheck(f"""
        func.func @causal(%arg0: {SCORES}, %a: {SCALAR}) -> {SCORES} {{
          %mask = torch.vtensor.literal(dense<[[[[false, true, true, true, true, true, true, true, true, true, true,
                                                 true, true, true, true, true, true, true, true]]]]> : tensor<1x1x1x19xi1>) : {MASK}
          %all = torch.vtensor.literal(dense<true> : tensor<1x1x1x19xi1>) : {MASK}
          %0 = torch.aten.where.self %mask, %a, %arg0 : {MASK}, {SCALAR}, {SCORES} -> {SCORES}
          %1 = torch.aten.where.self %all, %0, %a : {MASK}, {SCORES}, {SCALAR} -> {SCORES}
          return %1 : {SCORES}
        }}
    """, """
        # CHECK-LABEL: func.func @causal
        # CHECK-NOT:     tensor<1x1x1x19xi1>) : !torch.vtensor<[1,1,1,19],i1>
        # CHECK:         %[[BYTES:.+]] = torch.vtensor.literal(dense<{{\\[\\[\\[\\[}}0, 1, 1, {{.*}}> : tensor<1x1x1x19xui8>) : !torch.vtensor<[1,1,1,19],ui8>
        # CHECK-NEXT:    %[[ZERO:.+]] = torch.constant.int 0
        # CHECK-NEXT:    %[[MASK:.+]] = torch.aten.ne.Scalar %[[BYTES]], %[[ZERO]] : !torch.vtensor<[1,1,1,19],ui8>, !torch.int -> !torch.vtensor<[1,1,1,19],i1>
        # CHECK-NEXT:    %[[ALL:.+]] = torch.vtensor.literal(dense<true> : tensor<1x1x1x19xi1>)
        # CHECK:         %[[W:.+]] = torch.aten.where.self %[[MASK]], %arg1, %arg0
        # CHECK:         torch.aten.where.self %[[ALL]], %[[W]], %arg1
    """)
