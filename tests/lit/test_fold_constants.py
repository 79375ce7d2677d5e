"""FileCheck tests of tori-fold-constants: torch-dialect IR in, the folded IR out."""

import pytest

from tori.passes.fold_constants import FOLD_LIMIT

PIPELINE = "tori-fold-constants"


def test_literal_arithmetic_folds_to_one_literal(filecheck):
    filecheck("""
        func.func @add() -> !torch.vtensor<[3],f32> {
          %0 = torch.vtensor.literal(dense<[1.0, 2.0, 3.0]> : tensor<3xf32>) : !torch.vtensor<[3],f32>
          %1 = torch.vtensor.literal(dense<[10.0, 20.0, 30.0]> : tensor<3xf32>) : !torch.vtensor<[3],f32>
          %int1 = torch.constant.int 1
          %2 = torch.aten.add.Tensor %0, %1, %int1 : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.int -> !torch.vtensor<[3],f32>
          return %2 : !torch.vtensor<[3],f32>
        }
    """, """
        # CHECK-LABEL: func.func @add
        # CHECK-NEXT:    %[[SUM:.+]] = torch.vtensor.literal(dense<[1.100000e+01, 2.200000e+01, 3.300000e+01]> : tensor<3xf32>) : !torch.vtensor<[3],f32>
        # CHECK-NEXT:    return %[[SUM]]
        # CHECK-NOT:   torch.aten
    """)


def test_scalar_arithmetic_folds_to_a_constant(filecheck):
    filecheck("""
        func.func @scalars() -> !torch.int {
          %int3 = torch.constant.int 3
          %int4 = torch.constant.int 4
          %0 = torch.aten.mul.int %int3, %int4 : !torch.int, !torch.int -> !torch.int
          return %0 : !torch.int
        }
    """, """
        # CHECK-LABEL: func.func @scalars
        # CHECK-NEXT:    %[[C:.+]] = torch.constant.int 12
        # CHECK-NEXT:    return %[[C]] : !torch.int
    """)


def test_transpose_and_permute_of_a_literal_fold(filecheck):
    filecheck("""
        func.func @transpose() -> (!torch.vtensor<[3,2],si32>, !torch.vtensor<[3,2],si32>) {
          %0 = torch.vtensor.literal(dense<[[1, 2, 3], [4, 5, 6]]> : tensor<2x3xsi32>) : !torch.vtensor<[2,3],si32>
          %int0 = torch.constant.int 0
          %int1 = torch.constant.int 1
          %1 = torch.aten.transpose.int %0, %int0, %int1 : !torch.vtensor<[2,3],si32>, !torch.int, !torch.int -> !torch.vtensor<[3,2],si32>
          %dims = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
          %2 = torch.aten.permute %0, %dims : !torch.vtensor<[2,3],si32>, !torch.list<int> -> !torch.vtensor<[3,2],si32>
          return %1, %2 : !torch.vtensor<[3,2],si32>, !torch.vtensor<[3,2],si32>
        }
    """, """
        # CHECK-LABEL: func.func @transpose
        # CHECK-NOT:     torch.aten
        # CHECK-NOT:     torch.prim.ListConstruct
        # CHECK:         torch.vtensor.literal(dense<{{\\[}}[1, 4], [2, 5], [3, 6]]> : tensor<3x2xsi32>) : !torch.vtensor<[3,2],si32>
        # CHECK:         torch.vtensor.literal(dense<{{\\[}}[1, 4], [2, 5], [3, 6]]> : tensor<3x2xsi32>) : !torch.vtensor<[3,2],si32>
        # CHECK-NOT:     torch.aten
    """)


def test_chains_of_constant_ops_fold_fully(filecheck):
    # arange -> reshape -> softmax -> mul: what a model builds from constants in forward.
    filecheck("""
        func.func @chain() -> !torch.vtensor<[2,2],f32> {
          %int0 = torch.constant.int 0
          %int1 = torch.constant.int 1
          %int2 = torch.constant.int 2
          %int4 = torch.constant.int 4
          %int6 = torch.constant.int 6
          %none = torch.constant.none
          %cpu = torch.constant.device "cpu"
          %false = torch.constant.bool false
          %0 = torch.aten.arange.start_step %int0, %int4, %int1, %int6, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[4],f32>
          %shape = torch.prim.ListConstruct %int2, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
          %1 = torch.aten.view %0, %shape : !torch.vtensor<[4],f32>, !torch.list<int> -> !torch.vtensor<[2,2],f32>
          %2 = torch.aten._softmax %1, %int1, %false : !torch.vtensor<[2,2],f32>, !torch.int, !torch.bool -> !torch.vtensor<[2,2],f32>
          %3 = torch.aten.mul.Scalar %2, %int2 : !torch.vtensor<[2,2],f32>, !torch.int -> !torch.vtensor<[2,2],f32>
          return %3 : !torch.vtensor<[2,2],f32>
        }
    """, """
        # CHECK-LABEL: func.func @chain
        # CHECK-NEXT:    %[[T:.+]] = torch.vtensor.literal(dense<{{\\[}}[0.537882{{[0-9]*}}, 1.46211{{[0-9e+-]*}}], [0.537882{{[0-9]*}}, 1.46211{{[0-9e+-]*}}]]> : tensor<2x2xf32>) : !torch.vtensor<[2,2],f32>
        # CHECK-NEXT:    return %[[T]]
    """)


def test_an_op_with_a_non_constant_operand_stays(filecheck):
    filecheck("""
        func.func @mixed(%arg0: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
          %0 = torch.vtensor.literal(dense<[1.0, 2.0, 3.0]> : tensor<3xf32>) : !torch.vtensor<[3],f32>
          %int1 = torch.constant.int 1
          %1 = torch.aten.add.Tensor %arg0, %0, %int1 : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.int -> !torch.vtensor<[3],f32>
          return %1 : !torch.vtensor<[3],f32>
        }
    """, """
        # CHECK-LABEL: func.func @mixed
        # CHECK:         %[[LIT:.+]] = torch.vtensor.literal(dense<[1.000000e+00, 2.000000e+00, 3.000000e+00]>
        # CHECK:         torch.aten.add.Tensor %arg0, %[[LIT]]
    """)


def test_random_ops_stay(filecheck):
    filecheck("""
        func.func @random() -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
          %int4 = torch.constant.int 4
          %int6 = torch.constant.int 6
          %none = torch.constant.none
          %cpu = torch.constant.device "cpu"
          %false = torch.constant.bool false
          %float = torch.constant.float 5.000000e-01
          %size = torch.prim.ListConstruct %int4 : (!torch.int) -> !torch.list<int>
          %0 = torch.aten.rand %size, %int6, %none, %cpu, %false : !torch.list<int>, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[4],f32>
          %1 = torch.vtensor.literal(dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>) : !torch.vtensor<[4],f32>
          %true = torch.constant.bool true
          %2 = torch.aten.dropout %1, %float, %true : !torch.vtensor<[4],f32>, !torch.float, !torch.bool -> !torch.vtensor<[4],f32>
          return %0, %2 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
        }
    """, """
        # CHECK-LABEL: func.func @random
        # CHECK:         torch.aten.rand
        # CHECK:         torch.aten.dropout
    """)


def test_in_place_ops_stay(filecheck):
    filecheck("""
        func.func @in_place() -> !torch.tensor<[2],f32> {
          %0 = torch.tensor.literal(dense<[1.0, 2.0]> : tensor<2xf32>) : !torch.tensor<[2],f32>
          %int2 = torch.constant.int 2
          %1 = torch.aten.mul_.Scalar %0, %int2 : !torch.tensor<[2],f32>, !torch.int -> !torch.tensor<[2],f32>
          return %1 : !torch.tensor<[2],f32>
        }
    """, """
        # CHECK-LABEL: func.func @in_place
        # CHECK:         torch.aten.mul_.Scalar
    """)


def test_a_result_above_the_size_limit_stays(filecheck):
    side = int(FOLD_LIMIT ** 0.5) + 1  # side * side elements: just above the limit
    filecheck(f"""
        func.func @large() -> !torch.vtensor<[{side},{side}],f32> {{
          %int{side} = torch.constant.int {side}
          %float = torch.constant.float 1.500000e+00
          %none = torch.constant.none
          %size = torch.prim.ListConstruct %int{side}, %int{side} : (!torch.int, !torch.int) -> !torch.list<int>
          %0 = torch.aten.full %size, %float, %none, %none, %none, %none : !torch.list<int>, !torch.float, !torch.none, !torch.none, !torch.none, !torch.none -> !torch.vtensor<[{side},{side}],f32>
          return %0 : !torch.vtensor<[{side},{side}],f32>
        }}
    """, """
        # CHECK-LABEL: func.func @large
        # CHECK:         torch.aten.full
        # CHECK-NOT:     torch.vtensor.literal
    """)


def test_a_result_within_the_size_limit_is_a_splat(filecheck):
    filecheck("""
        func.func @splat() -> !torch.vtensor<[64,64],f32> {
          %int64 = torch.constant.int 64
          %float = torch.constant.float 1.500000e+00
          %none = torch.constant.none
          %size = torch.prim.ListConstruct %int64, %int64 : (!torch.int, !torch.int) -> !torch.list<int>
          %0 = torch.aten.full %size, %float, %none, %none, %none, %none : !torch.list<int>, !torch.float, !torch.none, !torch.none, !torch.none, !torch.none -> !torch.vtensor<[64,64],f32>
          return %0 : !torch.vtensor<[64,64],f32>
        }
    """, """
        # CHECK-LABEL: func.func @splat
        # CHECK-NEXT:    torch.vtensor.literal(dense<1.500000e+00> : tensor<64x64xf32>) : !torch.vtensor<[64,64],f32>
    """)


def test_a_large_result_is_inline_whatever_its_type(filecheck):
    # IREE's input conversion copies resource blobs into ones that iree-compile cannot
    # write as bytecode (Llama's causal masks, GPT-2's position ids): folded results are
    # always inline.
    filecheck("""
        func.func @inline() -> (!torch.vtensor<[32],si64>, !torch.vtensor<[32],f32>) {
          %int0 = torch.constant.int 0
          %int1 = torch.constant.int 1
          %int6 = torch.constant.int 6
          %int32 = torch.constant.int 32
          %none = torch.constant.none
          %0 = torch.aten.arange.start_step %int0, %int32, %int1, %none, %none, %none, %none : !torch.int, !torch.int, !torch.int, !torch.none, !torch.none, !torch.none, !torch.none -> !torch.vtensor<[32],si64>
          %1 = torch.aten.mul.Tensor %0, %0 : !torch.vtensor<[32],si64>, !torch.vtensor<[32],si64> -> !torch.vtensor<[32],si64>
          %2 = torch.aten.arange.start_step %int0, %int32, %int1, %int6, %none, %none, %none : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.none, !torch.none -> !torch.vtensor<[32],f32>
          %3 = torch.aten.mul.Tensor %2, %2 : !torch.vtensor<[32],f32>, !torch.vtensor<[32],f32> -> !torch.vtensor<[32],f32>
          return %1, %3 : !torch.vtensor<[32],si64>, !torch.vtensor<[32],f32>
        }
    """, """
        # CHECK-LABEL: func.func @inline
        # CHECK-DAG:     torch.vtensor.literal(dense<[0, 1, 4, 9, 16, {{.*}}, 961]> : tensor<32xsi64>) : !torch.vtensor<[32],si64>
        # CHECK-DAG:     torch.vtensor.literal(dense<[0.000000e+00, 1.000000e+00, 4.000000e+00, {{.*}}, 9.610000e+02]> : tensor<32xf32>) : !torch.vtensor<[32],f32>
        # CHECK-NOT:     torch.aten
        # CHECK-NOT:     dialect_resources
    """)


def test_a_resource_literal_from_the_importer_is_read(filecheck):
    filecheck("""
        module {
          func.func @resource() -> !torch.vtensor<[2],f32> {
            %0 = torch.vtensor.literal(dense_resource<torch_tensor_2_torch.float32> : tensor<2xf32>) : !torch.vtensor<[2],f32>
            %1 = torch.aten.neg %0 : !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
            return %1 : !torch.vtensor<[2],f32>
          }
        }
        {-#
          dialect_resources: {
            builtin: {
              torch_tensor_2_torch.float32: "0x040000000000803F00000040"
            }
          }
        #-}
    """, """
        # CHECK-LABEL: func.func @resource
        # CHECK-NEXT:    torch.vtensor.literal(dense<[-1.000000e+00, -2.000000e+00]> : tensor<2xf32>) : !torch.vtensor<[2],f32>
        # CHECK-NOT:     torch.aten.neg
    """)


@pytest.mark.parametrize("dtype, values, folded", [
    ("f16", "[1.5, -2.25]", "dense<[3.000000e+00, -4.500000e+00]> : tensor<2xf16>"),
    ("bf16", "[1.5, -2.25]", "dense<[3.000000e+00, -4.500000e+00]> : tensor<2xbf16>"),
    ("si64", "[4611686018427387904, -7]", "dense<[-9223372036854775808, -14]> : tensor<2xsi64>"),
])
def test_literals_keep_their_dtype(filecheck, dtype, values, folded):
    filecheck(f"""
        func.func @double() -> !torch.vtensor<[2],{dtype}> {{
          %0 = torch.vtensor.literal(dense<{values}> : tensor<2x{dtype}>) : !torch.vtensor<[2],{dtype}>
          %int2 = torch.constant.int 2
          %1 = torch.aten.mul.Scalar %0, %int2 : !torch.vtensor<[2],{dtype}>, !torch.int -> !torch.vtensor<[2],{dtype}>
          return %1 : !torch.vtensor<[2],{dtype}>
        }}
    """, f"""
        # CHECK-LABEL: func.func @double
        # CHECK-NEXT:    torch.vtensor.literal({folded}) : !torch.vtensor<[2],{dtype}>
    """)


def test_bool_literals_keep_their_dtype(filecheck):
    filecheck("""
        func.func @logical() -> !torch.vtensor<[3],i1> {
          %0 = torch.vtensor.literal(dense<[true, false, true]> : tensor<3xi1>) : !torch.vtensor<[3],i1>
          %1 = torch.aten.logical_not %0 : !torch.vtensor<[3],i1> -> !torch.vtensor<[3],i1>
          return %1 : !torch.vtensor<[3],i1>
        }
    """, """
        # CHECK-LABEL: func.func @logical
        # CHECK-NEXT:    torch.vtensor.literal(dense<[false, true, false]> : tensor<3xi1>) : !torch.vtensor<[3],i1>
    """)


def test_a_large_bool_result_is_inline(filecheck):
    # IREE crashes on an i1 resource blob ("ElementsAttr does not provide iteration
    # facilities for type `llvm::APInt`"): a causal mask folds to an inline literal.
    filecheck("""
        func.func @causal() -> !torch.vtensor<[6,6],i1> {
          %int6 = torch.constant.int 6
          %int0 = torch.constant.int 0
          %int11 = torch.constant.int 11
          %none = torch.constant.none
          %cpu = torch.constant.device "cpu"
          %false = torch.constant.bool false
          %size = torch.prim.ListConstruct %int6, %int6 : (!torch.int, !torch.int) -> !torch.list<int>
          %0 = torch.aten.ones %size, %int11, %none, %cpu, %false : !torch.list<int>, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[6,6],i1>
          %1 = torch.aten.tril %0, %int0 : !torch.vtensor<[6,6],i1>, !torch.int -> !torch.vtensor<[6,6],i1>
          return %1 : !torch.vtensor<[6,6],i1>
        }
    """, """
        # CHECK-LABEL: func.func @causal
        # CHECK-NEXT:    torch.vtensor.literal(dense<{{\\[}}[true, false, false, false, false, false], {{.*}}]> : tensor<6x6xi1>) : !torch.vtensor<[6,6],i1>
        # CHECK-NOT:     dense_resource
    """)


def test_a_dtype_the_ir_does_not_declare_stays(filecheck):
    # PyTorch's add of an si32 and an f32 literal is f32; the IR claiming si32 is kept as written.
    filecheck("""
        func.func @mismatch() -> !torch.vtensor<[2],si32> {
          %0 = torch.vtensor.literal(dense<[1, 2]> : tensor<2xsi32>) : !torch.vtensor<[2],si32>
          %1 = torch.vtensor.literal(dense<[1.5, 2.5]> : tensor<2xf32>) : !torch.vtensor<[2],f32>
          %int1 = torch.constant.int 1
          %2 = torch.aten.add.Tensor %0, %1, %int1 : !torch.vtensor<[2],si32>, !torch.vtensor<[2],f32>, !torch.int -> !torch.vtensor<[2],si32>
          return %2 : !torch.vtensor<[2],si32>
        }
    """, """
        # CHECK-LABEL: func.func @mismatch
        # CHECK:         torch.aten.add.Tensor
    """)


def test_full_like_of_empty_folds_and_the_empty_goes(filecheck):
    # AOTAutograd writes torch.ones(...) as full_like(empty_strided(...)): only the shape of
    # the empty tensor matters, so full_like folds although empty_strided never does.
    filecheck("""
        func.func @ones() -> !torch.vtensor<[4],f16> {
          %int1 = torch.constant.int 1
          %int3 = torch.constant.int 3
          %int4 = torch.constant.int 4
          %int5 = torch.constant.int 5
          %none = torch.constant.none
          %false = torch.constant.bool false
          %cpu = torch.constant.device "cpu"
          %size = torch.prim.ListConstruct %int4 : (!torch.int) -> !torch.list<int>
          %stride = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
          %0 = torch.aten.empty_strided %size, %stride, %int5, %none, %cpu, %false : !torch.list<int>, !torch.list<int>, !torch.int, !torch.none, !torch.Device, !torch.bool -> !torch.vtensor<[4],f16>
          %1 = torch.aten.full_like %0, %int1, %none, %none, %none, %false, %none : !torch.vtensor<[4],f16>, !torch.int, !torch.none, !torch.none, !torch.none, !torch.bool, !torch.none -> !torch.vtensor<[4],f16>
          %2 = torch.aten.mul.Scalar %1, %int3 : !torch.vtensor<[4],f16>, !torch.int -> !torch.vtensor<[4],f16>
          return %2 : !torch.vtensor<[4],f16>
        }
    """, """
        # CHECK-LABEL: func.func @ones
        # CHECK-NEXT:    torch.vtensor.literal(dense<3.000000e+00> : tensor<4xf16>) : !torch.vtensor<[4],f16>
        # CHECK-NEXT:    return
    """)


def test_an_op_pytorch_cannot_evaluate_stays(filecheck):
    # Index 5 is out of range for a 2-element literal: PyTorch raises, the op is kept for IREE.
    filecheck("""
        func.func @bad_index() -> !torch.vtensor<[],f32> {
          %0 = torch.vtensor.literal(dense<[1.0, 2.0]> : tensor<2xf32>) : !torch.vtensor<[2],f32>
          %int0 = torch.constant.int 0
          %int5 = torch.constant.int 5
          %1 = torch.aten.select.int %0, %int0, %int5 : !torch.vtensor<[2],f32>, !torch.int, !torch.int -> !torch.vtensor<[],f32>
          return %1 : !torch.vtensor<[],f32>
        }
    """, """
        # CHECK-LABEL: func.func @bad_index
        # CHECK:         torch.aten.select.int
    """)


def test_arithmetic_on_an_assumed_constant_folds_through_its_origin(filecheck):
    filecheck("""
        func.func @assumed() -> !torch.vtensor<[2],f32> {
          %0 = torch.vtensor.literal(dense<[1.0, 2.0]> : tensor<2xf32>) : !torch.vtensor<[2],f32>
          %1 = "tori.assumed_constant"(%0) {function = "model.table", source = "model.py:3"} : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32>
          %int3 = torch.constant.int 3
          %2 = torch.aten.mul.Scalar %1, %int3 : !torch.vtensor<[2],f32>, !torch.int -> !torch.vtensor<[2],f32>
          return %2 : !torch.vtensor<[2],f32>
        }
    """, """
        # CHECK-LABEL: func.func @assumed
        # CHECK-NEXT:    %[[T:.+]] = torch.vtensor.literal(dense<[3.000000e+00, 6.000000e+00]> : tensor<2xf32>) : !torch.vtensor<[2],f32>
        # CHECK-NEXT:    return %[[T]]
        # CHECK-NOT:     tori.assumed_constant
    """)


def test_an_assumed_constant_used_with_an_argument_keeps_its_origin(filecheck):
    filecheck("""
        func.func @kept(%arg0: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
          %0 = torch.vtensor.literal(dense<[1.0, 2.0]> : tensor<2xf32>) : !torch.vtensor<[2],f32>
          %1 = "tori.assumed_constant"(%0) {function = "model.table", source = "model.py:3"} : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32>
          %int2 = torch.constant.int 2
          %2 = torch.aten.mul.Scalar %1, %int2 : !torch.vtensor<[2],f32>, !torch.int -> !torch.vtensor<[2],f32>
          %3 = torch.aten.mul.Tensor %arg0, %1 : !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
          %4 = torch.aten.add.Tensor %3, %2, %int2 : !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>, !torch.int -> !torch.vtensor<[2],f32>
          return %4 : !torch.vtensor<[2],f32>
        }
    """, """
        # CHECK-LABEL: func.func @kept
        # CHECK-DAG:     %[[ORIGIN:.+]] = "tori.assumed_constant"(%{{.+}}) {function = "model.table", source = "model.py:3"}
        # CHECK-DAG:     %[[DOUBLED:.+]] = torch.vtensor.literal(dense<[2.000000e+00, 4.000000e+00]>
        # CHECK:         %[[PRODUCT:.+]] = torch.aten.mul.Tensor %arg0, %[[ORIGIN]]
        # CHECK:         torch.aten.add.Tensor %[[PRODUCT]], %[[DOUBLED]]
    """)
