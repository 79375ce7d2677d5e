"""FileCheck tests of the tori dialect: its ops parse, print and verify; invalid
facts are rejected with the verifier's message."""

import re

import pytest
from torch_mlir import ir

from tori.frontend.importer import new_context

PIPELINE = ""


def test_facts_and_origin_round_trip(filecheck):
    filecheck("""
        func.func @facts(%arg0: !torch.vtensor<[?,4],f32>, %arg1: !torch.int) -> !torch.vtensor<[?,4],f32> {
          %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, min = 2 : i64, max = "inf", divisor = 8 : i64} : (!torch.vtensor<[?,4],f32>) -> !torch.vtensor<[?,4],f32>
          %1 = "tori.int_facts"(%arg1) {min = 2 : i64, max = 64 : i64, divisor = 1 : i64} : (!torch.int) -> !torch.int
          %2 = torch.vtensor.literal(dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>) : !torch.vtensor<[4],f32>
          %3 = "tori.assumed_constant"(%2) {function = "model.table", source = "model.py:12"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
          %int1 = torch.constant.int 1
          %4 = torch.aten.add.Tensor %0, %3, %int1 : !torch.vtensor<[?,4],f32>, !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[?,4],f32>
          return %4 : !torch.vtensor<[?,4],f32>
        }
    """, """
        # CHECK-LABEL: func.func @facts
        # CHECK:         "tori.dim_facts"(%arg0) {dim = 0 : i64, divisor = 8 : i64, max = "inf", min = 2 : i64}
        # CHECK:         "tori.int_facts"(%arg1) {divisor = 1 : i64, max = 64 : i64, min = 2 : i64}
        # CHECK:         "tori.assumed_constant"(%{{.+}}) {function = "model.table", source = "model.py:12"}
    """)


def test_facts_on_a_static_dim_that_satisfies_them_verify(filecheck):
    filecheck("""
        func.func @static(%arg0: !torch.vtensor<[16,4],f32>) -> !torch.vtensor<[16,4],f32> {
          %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, min = 16 : i64, max = 16 : i64, divisor = 8 : i64} : (!torch.vtensor<[16,4],f32>) -> !torch.vtensor<[16,4],f32>
          return %0 : !torch.vtensor<[16,4],f32>
        }
    """, """
        # CHECK: "tori.dim_facts"(%arg0) {dim = 0 : i64, divisor = 8 : i64, max = 16 : i64, min = 16 : i64}
    """)


def _dim_facts(attributes: str, type_: str = "!torch.vtensor<[?,4],f32>") -> str:
    return f"""
        func.func @f(%arg0: {type_}) -> {type_} {{
          %0 = "tori.dim_facts"(%arg0) {{{attributes}}} : ({type_}) -> {type_}
          return %0 : {type_}
        }}
    """


@pytest.mark.parametrize("source, message", [
    (_dim_facts('dim = 2 : i64, min = 1 : i64, max = "inf", divisor = 1 : i64'),
     "'tori.dim_facts' op dim 2 is out of range for a tensor of rank 2"),
    (_dim_facts('dim = -1 : i64, min = 1 : i64, max = "inf", divisor = 1 : i64'),
     "dim -1 is out of range for a tensor of rank 2"),
    (_dim_facts('dim = 0 : i64, min = 9 : i64, max = 4 : i64, divisor = 1 : i64'),
     "has contradictory facts: min 9 is greater than max 4"),
    (_dim_facts('dim = 0 : i64, min = 1 : i64, max = "inf", divisor = 0 : i64'),
     "has contradictory facts: divisor 0 is not at least 1"),
    (_dim_facts('dim = 0 : i64, min = 6 : i64, max = 6 : i64, divisor = 4 : i64'),
     "the pinned size 6 is not a multiple of divisor 4"),
    (_dim_facts('dim = 0 : i64, min = 1 : i64, max = "many", divisor = 1 : i64'),
     'max is "many"; an unbounded max is written "inf"'),
    (_dim_facts('dim = 1 : i64, min = 1 : i64, max = "inf", divisor = 8 : i64'),
     re.escape("static size 4 of dim 1 violates its facts [1, inf] % 8")),
    (_dim_facts('dim = 1 : i64, min = 5 : i64, max = "inf", divisor = 1 : i64'),
     re.escape("static size 4 of dim 1 violates its facts [5, inf]")),
    (_dim_facts('dim = 0 : i64, min = 1 : i64, max = "inf", divisor = 1 : i64', "!torch.int"),
     "operand must be a !torch.vtensor, not !torch.int"),
    ("""
        func.func @f(%arg0: !torch.int) -> !torch.int {
          %0 = "tori.int_facts"(%arg0) {min = 3 : i64, max = 2 : i64, divisor = 1 : i64} : (!torch.int) -> !torch.int
          return %0 : !torch.int
        }
    """, "'tori.int_facts' op has contradictory facts: min 3 is greater than max 2"),
    ("""
        func.func @f(%arg0: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
          %0 = "tori.assumed_constant"(%arg0) {function = "table", source = ""} : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32>
          return %0 : !torch.vtensor<[2],f32>
        }
    """, "'tori.assumed_constant' op operand must be a constant"),
    ("""
        func.func @f() -> !torch.vtensor<[2],f32> {
          %0 = torch.vtensor.literal(dense<[1.0, 2.0]> : tensor<2xf32>) : !torch.vtensor<[2],f32>
          %1 = "tori.assumed_constant"(%0) {function = "", source = ""} : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32>
          return %1 : !torch.vtensor<[2],f32>
        }
    """, "needs the name of the function whose result it is"),
    ("""
        func.func @f(%arg0: !torch.vtensor<[?],f32>) -> !torch.vtensor<[4],f32> {
          %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, min = 4 : i64, max = 4 : i64, divisor = 1 : i64} : (!torch.vtensor<[?],f32>) -> !torch.vtensor<[4],f32>
          return %0 : !torch.vtensor<[4],f32>
        }
    """, re.escape("result type !torch.vtensor<[4],f32> differs from operand type")),
])
def test_invalid_facts_are_rejected_by_the_verifier(source, message):
    with pytest.raises(ir.MLIRError, match=message):
        ir.Module.parse(source, context=new_context())


def test_every_context_tori_makes_has_the_dialect():
    for _ in range(2):
        context = new_context()
        assert context.is_dialect_loaded("tori")
