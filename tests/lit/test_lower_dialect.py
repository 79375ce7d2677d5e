"""FileCheck tests of tori-lower-dialect: every tori op is replaced by its operand."""

import pytest
from torch_mlir import ir

from tori.config import Options
from tori.errors import CompileError
from tori.frontend.importer import new_context
from tori.passes.lower_dialect import check_lowered, lower_for_iree

PIPELINE = "tori-lower-dialect"


def test_facts_and_origins_are_replaced_by_their_operands(filecheck):
    filecheck("""
        func.func @lower(%arg0: !torch.vtensor<[?,4],f32>, %arg1: !torch.int) -> (!torch.vtensor<[?,4],f32>, !torch.int) {
          %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, min = 2 : i64, max = "inf", divisor = 8 : i64} : (!torch.vtensor<[?,4],f32>) -> !torch.vtensor<[?,4],f32>
          %1 = "tori.int_facts"(%arg1) {min = 2 : i64, max = 64 : i64, divisor = 1 : i64} : (!torch.int) -> !torch.int
          %2 = torch.vtensor.literal(dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>) : !torch.vtensor<[4],f32>
          %3 = "tori.assumed_constant"(%2) {function = "model.table", source = ""} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
          %int1 = torch.constant.int 1
          %4 = torch.aten.add.Tensor %0, %3, %int1 : !torch.vtensor<[?,4],f32>, !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[?,4],f32>
          return %4, %1 : !torch.vtensor<[?,4],f32>, !torch.int
        }
    """, """
        # CHECK-LABEL: func.func @lower
        # CHECK-NOT:     tori.
        # CHECK:         %[[LIT:.+]] = torch.vtensor.literal
        # CHECK:         torch.aten.add.Tensor %arg0, %[[LIT]]
        # CHECK:         return %{{.+}}, %arg1
        # CHECK-NOT:     tori.
    """)


def test_lowering_reaches_into_nested_functions(filecheck):
    filecheck("""
        module {
          func.func private @region(%arg0: !torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32> {
            %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, min = 1 : i64, max = "inf", divisor = 1 : i64} : (!torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32>
            return %0 : !torch.vtensor<[?],f32>
          }
        }
    """, """
        # CHECK-LABEL: func.func private @region
        # CHECK-NEXT:    return %arg0
    """)


def test_a_module_without_tori_ops_is_unchanged(filecheck):
    out = filecheck("""
        func.func @plain(%arg0: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
          %0 = torch.aten.relu %arg0 : !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
          return %0 : !torch.vtensor<[2],f32>
        }
    """, """
        # CHECK: torch.aten.relu %arg0
    """)
    assert "tori." not in out


def test_a_tori_op_left_after_lowering_is_a_compile_error():
    # In a context without the dialect a tori op is an unregistered op that the
    # lowering does not know: it stays, and the check names it.
    from torch_mlir.dialects import torch as torch_d

    context = ir.Context()
    torch_d.register_dialect(context)
    context.allow_unregistered_dialects = True
    module = ir.Module.parse("""
        func.func @f(%arg0: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
          %0 = "tori.unknown_fact"(%arg0) : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32>
          return %0 : !torch.vtensor<[2],f32>
        }
    """, context=context)
    with pytest.raises(CompileError, match=r"1 op\(s\) of the tori dialect \(tori.unknown_fact\) are left") as raised:
        lower_for_iree(module, Options(), graph="g")
    assert raised.value.stage == "tori" and raised.value.op == "tori.unknown_fact"


def test_check_passes_on_lowered_ir():
    module = ir.Module.parse("""
        func.func @f(%arg0: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
          %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, min = 2 : i64, max = 2 : i64, divisor = 1 : i64} : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32>
          return %0 : !torch.vtensor<[2],f32>
        }
    """, context=new_context())
    lower_for_iree(module, Options())
    check_lowered(module)
    assert "tori." not in str(module)
