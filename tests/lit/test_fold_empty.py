"""FileCheck tests of tori-fold-empty-tensors: empty tensors become literals."""

PIPELINE = "tori-fold-empty-tensors"


def test_an_empty_argument_and_the_ops_on_it_become_a_literal(filecheck):
    filecheck("""
        func.func @f(%arg0: !torch.vtensor<[0,5],f32>) -> !torch.vtensor<[0,5],f32> {
          %0 = torch.aten.reciprocal %arg0 : !torch.vtensor<[0,5],f32> -> !torch.vtensor<[0,5],f32>
          return %0 : !torch.vtensor<[0,5],f32>
        }
    """, """
        # CHECK-LABEL: func.func @f(%arg0: !torch.vtensor<[0,5],f32>)
        # CHECK-NEXT:    %[[E:.+]] = torch.vtensor.literal(dense<> : tensor<0x5xf32>) : !torch.vtensor<[0,5],f32>
        # CHECK-NEXT:    return %[[E]]
        # CHECK-NOT:   torch.aten
    """)


def test_a_non_empty_result_of_an_empty_operand_keeps_its_op(filecheck):
    filecheck("""
        func.func @g(%arg0: !torch.vtensor<[3,0],f32>, %arg1: !torch.vtensor<[0,4],f32>) -> !torch.vtensor<[3,4],f32> {
          %0 = torch.aten.mm %arg0, %arg1 : !torch.vtensor<[3,0],f32>, !torch.vtensor<[0,4],f32> -> !torch.vtensor<[3,4],f32>
          return %0 : !torch.vtensor<[3,4],f32>
        }
    """, """
        # CHECK-LABEL: func.func @g
        # CHECK-DAG:     %[[A:.+]] = torch.vtensor.literal(dense<> : tensor<3x0xf32>)
        # CHECK-DAG:     %[[B:.+]] = torch.vtensor.literal(dense<> : tensor<0x4xf32>)
        # CHECK:         torch.aten.mm %[[A]], %[[B]]
    """)


def test_with_constant_folding_the_op_folds(filecheck):
    filecheck("""
        func.func @g(%arg0: !torch.vtensor<[3,0],f32>, %arg1: !torch.vtensor<[0,4],f32>) -> !torch.vtensor<[3,4],f32> {
          %0 = torch.aten.mm %arg0, %arg1 : !torch.vtensor<[3,0],f32>, !torch.vtensor<[0,4],f32> -> !torch.vtensor<[3,4],f32>
          return %0 : !torch.vtensor<[3,4],f32>
        }
    """, """
        # CHECK-LABEL: func.func @g
        # CHECK-NEXT:    %[[Z:.+]] = torch.vtensor.literal(dense<0.000000e+00> : tensor<3x4xf32>)
        # CHECK-NEXT:    return %[[Z]]
    """, pipeline="tori-fold-empty-tensors, tori-fold-constants")


def test_dynamic_and_non_empty_tensors_stay(filecheck):
    filecheck("""
        func.func @h(%arg0: !torch.vtensor<[?,5],f32>, %arg1: !torch.vtensor<[2,5],f32>) -> !torch.vtensor<[?,5],f32> {
          %0 = torch.aten.reciprocal %arg0 : !torch.vtensor<[?,5],f32> -> !torch.vtensor<[?,5],f32>
          return %0 : !torch.vtensor<[?,5],f32>
        }
    """, """
        # CHECK-LABEL: func.func @h
        # CHECK-NOT:     torch.vtensor.literal
        # CHECK:         torch.aten.reciprocal %arg0
    """)


def test_a_returned_uint8_tensor_becomes_an_empty_op(filecheck):
    # IREE folds a returned uint8 literal to signless i8 and then rejects it.
    filecheck("""
        func.func @r(%arg0: !torch.vtensor<[0],ui8>) -> (!torch.vtensor<[0],ui8>, !torch.vtensor<[0],ui8>) {
          %0 = torch.aten.neg %arg0 : !torch.vtensor<[0],ui8> -> !torch.vtensor<[0],ui8>
          %1 = torch.aten.neg %0 : !torch.vtensor<[0],ui8> -> !torch.vtensor<[0],ui8>
          return %0, %1 : !torch.vtensor<[0],ui8>, !torch.vtensor<[0],ui8>
        }
    """, """
        # CHECK-LABEL: func.func @r
        # CHECK-NOT:     torch.vtensor.literal
        # CHECK:         %[[A:.+]] = torch.aten.empty.memory_format %{{.+}}, %int0
        # CHECK-SAME:      -> !torch.vtensor<[0],ui8>
        # CHECK:         %[[B:.+]] = torch.aten.empty.memory_format
        # CHECK-NEXT:    return %[[A]], %[[B]]
    """)
