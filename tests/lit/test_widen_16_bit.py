"""FileCheck tests of tori-widen-16-bit: a bf16 (f16) contraction for a CPU without
arithmetic for the type computes on float32 operands, each through IREE's
optimization barrier (IREE folds a widening back into the contraction), its result
converted back; contractions of other types, and the pass without options, are left
as they are."""

A, B, OUT = "!torch.vtensor<[4,8],bf16>", "!torch.vtensor<[8,16],bf16>", "!torch.vtensor<[4,16],bf16>"


def mm(dtype: str = "bf16") -> str:
    a, b, out = (t.replace("bf16", dtype) for t in (A, B, OUT))
    return f"""
        func.func @mm(%arg0: {a}, %arg1: {b}) -> {out} {{
          %0 = torch.aten.mm %arg0, %arg1 : {a}, {b} -> {out}
          return %0 : {out}
        }}
    """


def test_bf16_matmul_computes_on_float32_operands_kept_from_folding(filecheck):
    filecheck(mm(), """
        # CHECK-LABEL: func.func @mm
        # CHECK:         %[[F32:.+]] = torch.constant.int 6
        # CHECK:         %[[A:.+]] = torch.prims.convert_element_type %arg0, %[[F32]] : !torch.vtensor<[4,8],bf16>, !torch.int -> !torch.vtensor<[4,8],f32>
        # CHECK:         %[[AT:.+]] = "torch_c.to_builtin_tensor"(%[[A]]) : (!torch.vtensor<[4,8],f32>) -> tensor<4x8xf32>
        # CHECK:         %[[AK:.+]] = "util.optimization_barrier"(%[[AT]]) : (tensor<4x8xf32>) -> tensor<4x8xf32>
        # CHECK:         %[[AW:.+]] = "torch_c.from_builtin_tensor"(%[[AK]]) : (tensor<4x8xf32>) -> !torch.vtensor<[4,8],f32>
        # CHECK:         %[[B:.+]] = torch.prims.convert_element_type %arg1, %[[F32]]
        # CHECK:         "util.optimization_barrier"
        # CHECK:         %[[BW:.+]] = "torch_c.from_builtin_tensor"({{.+}}) : (tensor<8x16xf32>) -> !torch.vtensor<[8,16],f32>
        # CHECK:         %[[R:.+]] = torch.aten.mm %[[AW]], %[[BW]] : !torch.vtensor<[4,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[4,16],f32>
        # CHECK:         %[[BF16:.+]] = torch.constant.int 15
        # CHECK:         %[[N:.+]] = torch.prims.convert_element_type %[[R]], %[[BF16]] : !torch.vtensor<[4,16],f32>, !torch.int -> !torch.vtensor<[4,16],bf16>
        # CHECK:         return %[[N]]
    """, pipeline="tori-widen-16-bit{bf16=true}")


def test_f16_matmul_is_widened_only_when_f16_is_asked_for(filecheck):
    filecheck(mm("f16"), """
        # CHECK-LABEL: func.func @mm
        # CHECK:         torch.aten.mm %arg0, %arg1 : !torch.vtensor<[4,8],f16>, !torch.vtensor<[8,16],f16> -> !torch.vtensor<[4,16],f16>
        # CHECK-NOT:     util.optimization_barrier
    """, pipeline="tori-widen-16-bit{bf16=true}")
    filecheck(mm("f16"), """
        # CHECK-LABEL: func.func @mm
        # CHECK:         util.optimization_barrier
        # CHECK:         torch.aten.mm {{.+}} -> !torch.vtensor<[4,16],f32>
    """, pipeline="tori-widen-16-bit{f16=true}")


def test_without_options_and_for_float32_nothing_changes(filecheck):
    filecheck(mm(), """
        # CHECK-LABEL: func.func @mm
        # CHECK-NEXT:    torch.aten.mm %arg0, %arg1 : !torch.vtensor<[4,8],bf16>, !torch.vtensor<[8,16],bf16> -> !torch.vtensor<[4,16],bf16>
        # CHECK-NEXT:    return
    """, pipeline="tori-widen-16-bit")
    filecheck(mm("f32"), """
        # CHECK-LABEL: func.func @mm
        # CHECK-NEXT:    torch.aten.mm %arg0, %arg1 : !torch.vtensor<[4,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[4,16],f32>
        # CHECK-NEXT:    return
    """, pipeline="tori-widen-16-bit{bf16=true f16=true}")


def test_float32_matmul_of_widened_bf16_operands_keeps_them_widened(filecheck):
    a, a32 = "!torch.vtensor<[4,8],bf16>", "!torch.vtensor<[4,8],f32>"
    b32, out = "!torch.vtensor<[8,16],f32>", "!torch.vtensor<[4,16],f32>"
    filecheck(f"""
        func.func @mm(%arg0: {a}, %arg1: {b32}) -> {out} {{
          %int6 = torch.constant.int 6
          %0 = torch.prims.convert_element_type %arg0, %int6 : {a}, !torch.int -> {a32}
          %1 = torch.aten.mm %0, %arg1 : {a32}, {b32} -> {out}
          return %1 : {out}
        }}
    """, """
        # CHECK-LABEL: func.func @mm
        # CHECK:         %[[W:.+]] = torch.prims.convert_element_type %arg0
        # CHECK:         %[[T:.+]] = "torch_c.to_builtin_tensor"(%[[W]])
        # CHECK:         %[[K:.+]] = "util.optimization_barrier"(%[[T]])
        # CHECK:         %[[A:.+]] = "torch_c.from_builtin_tensor"(%[[K]])
        # CHECK:         torch.aten.mm %[[A]], %arg1 : !torch.vtensor<[4,8],f32>, !torch.vtensor<[8,16],f32>
    """, pipeline="tori-widen-16-bit{bf16=true}")
