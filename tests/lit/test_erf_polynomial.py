"""FileCheck tests of tori-erf-polynomial: a static float32 `erf` becomes a call of a
function holding one elementwise `linalg.generic` that evaluates a polynomial of degree
16 by fused multiply-adds, with no division; other element types, dynamic shapes and
modules for GPU targets (`cpu=false`) keep `torch.aten.erf`."""

PIPELINE = "tori-erf-polynomial"


def test_erf_becomes_a_polynomial_without_a_division(filecheck):
    output = filecheck("""
        func.func @gelu(%arg0: !torch.vtensor<[4,197,8],f32>) -> !torch.vtensor<[4,197,8],f32> {
          %0 = torch.aten.erf %arg0 : !torch.vtensor<[4,197,8],f32> -> !torch.vtensor<[4,197,8],f32>
          return %0 : !torch.vtensor<[4,197,8],f32>
        }
    """, """
        # CHECK-LABEL: func.func @gelu
        # CHECK:         %[[X:.+]] = "torch_c.to_builtin_tensor"(%arg0) : (!torch.vtensor<[4,197,8],f32>) -> tensor<4x197x8xf32>
        # CHECK:         %[[Y:.+]] = call @tori_erf_4x197x8_f32(%[[X]])
        # CHECK:         "torch_c.from_builtin_tensor"(%[[Y]]) : (tensor<4x197x8xf32>) -> !torch.vtensor<[4,197,8],f32>
        # CHECK-NOT:     torch.aten.erf
        # CHECK-LABEL: func.func private @tori_erf_4x197x8_f32
        # CHECK:         linalg.generic
        # CHECK-SAME:      iterator_types = ["parallel", "parallel", "parallel"]
        # CHECK:           arith.maximumf
        # CHECK:           arith.minimumf
        # CHECK-COUNT-17:  math.fma
        # CHECK:           math.absf
        # CHECK:           arith.cmpf oge
        # CHECK:           math.copysign
        # CHECK:           arith.select
        # CHECK:           linalg.yield
    """)
    assert "divf" not in output and "math.erf" not in output


def test_other_types_dynamic_shapes_and_gpu_modules_keep_erf(filecheck):
    source = """
        func.func @half(%arg0: !torch.vtensor<[8],f16>) -> !torch.vtensor<[8],f16> {
          %0 = torch.aten.erf %arg0 : !torch.vtensor<[8],f16> -> !torch.vtensor<[8],f16>
          return %0 : !torch.vtensor<[8],f16>
        }
        func.func @dynamic(%arg0: !torch.vtensor<[?,8],f32>) -> !torch.vtensor<[?,8],f32> {
          %0 = torch.aten.erf %arg0 : !torch.vtensor<[?,8],f32> -> !torch.vtensor<[?,8],f32>
          return %0 : !torch.vtensor<[?,8],f32>
        }
        func.func @gpu(%arg0: !torch.vtensor<[8],f32>) -> !torch.vtensor<[8],f32> {
          %0 = torch.aten.erf %arg0 : !torch.vtensor<[8],f32> -> !torch.vtensor<[8],f32>
          return %0 : !torch.vtensor<[8],f32>
        }
    """
    checks = """
        # CHECK-LABEL: func.func @half
        # CHECK:         torch.aten.erf
        # CHECK-LABEL: func.func @dynamic
        # CHECK:         torch.aten.erf
    """
    assert "tori_erf" not in filecheck(source.split("func.func @gpu")[0], checks)
    assert "tori_erf" not in filecheck(source, checks, pipeline="tori-erf-polynomial{cpu=false}")
