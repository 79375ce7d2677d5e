"""FileCheck tests of tori's transform spec (targets/kernel_configs.py), run by IREE's
preprocessing interpreter over linalg: narrow batched matmuls get their tiles by
layout and row count; a wider one is left to IREE."""

import subprocess

from iree.compiler.tools.binaries import find_tool

from lit.conftest import check_output
from tori.targets.kernel_configs import NARROW_BATCH_MATMUL, spec_path


def _batch_matmul(name: str, rows: int, lhs: str, rhs: str, k: int, n: int) -> str:
    return f"""
  %{name}_empty = tensor.empty() : tensor<4x{rows}x{n}xf32>
  %{name}_zero = linalg.fill ins(%zero : f32) outs(%{name}_empty : tensor<4x{rows}x{n}xf32>) -> tensor<4x{rows}x{n}xf32>
  %{name} = linalg.batch_matmul ins({lhs}, {rhs} : tensor<4x{rows}x{k}xf32>, tensor<4x{k}x{n}xf32>) outs(%{name}_zero : tensor<4x{rows}x{n}xf32>) -> tensor<4x{rows}x{n}xf32>"""


SOURCE = f"""
func.func @attention(%q: tensor<4x2x64xf32>, %k: tensor<4x512x64xf32>, %v: tensor<4x512x64xf32>,
                     %q1: tensor<4x1x64xf32>, %q16: tensor<4x16x64xf32>)
    -> (tensor<4x2x64xf32>, tensor<4x1x512xf32>, tensor<4x16x512xf32>) {{
  %zero = arith.constant 0.0 : f32
  %kt_empty = tensor.empty() : tensor<4x64x512xf32>
  %kt = linalg.transpose ins(%k : tensor<4x512x64xf32>) outs(%kt_empty : tensor<4x64x512xf32>) permutation = [0, 2, 1]
  {_batch_matmul("scores", 2, "%q", "%kt", 64, 512)}
  {_batch_matmul("out", 2, "%scores", "%v", 512, 64)}
  {_batch_matmul("one", 1, "%q1", "%kt", 64, 512)}
  {_batch_matmul("wide", 16, "%q16", "%kt", 64, 512)}
  return %out, %one, %wide : tensor<4x2x64xf32>, tensor<4x1x512xf32>, tensor<4x16x512xf32>
}}
"""

CHECKS = """
# CHECK-DAG: #[[DOT2:.+]] = #iree_cpu.lowering_config<distribution = [1, 2, 64, 0], vector_common_parallel = [1, 2, 8, 0], vector_reduction = [0, 0, 0, 64]>
# CHECK-DAG: #[[AXPY2:.+]] = #iree_cpu.lowering_config<distribution = [1, 2, 64, 0], vector_common_parallel = [1, 2, 64, 0], vector_reduction = [0, 0, 0, 4]>
# CHECK-DAG: #[[DOT1:.+]] = #iree_cpu.lowering_config<distribution = [1, 1, 64, 0], vector_common_parallel = [1, 1, 8, 0], vector_reduction = [0, 0, 0, 64]>
# CHECK-DAG: #[[PIPELINE:.+]] = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>
# CHECK-DAG: #[[INFO_DOT2:.+]] = #iree_codegen.compilation_info<lowering_config = #[[DOT2]], translation_info = #[[PIPELINE]]>
# CHECK-DAG: #[[INFO_AXPY2:.+]] = #iree_codegen.compilation_info<lowering_config = #[[AXPY2]], translation_info = #[[PIPELINE]]>
# CHECK-DAG: #[[INFO_DOT1:.+]] = #iree_codegen.compilation_info<lowering_config = #[[DOT1]], translation_info = #[[PIPELINE]]>
# CHECK-LABEL: func.func @attention
# CHECK: linalg.batch_matmul {compilation_info = #[[INFO_DOT2]]} ins(%arg0, %transposed
# CHECK: linalg.batch_matmul {compilation_info = #[[INFO_AXPY2]]} ins(%{{.+}}, %arg2
# CHECK: linalg.batch_matmul {compilation_info = #[[INFO_DOT1]]} ins(%arg3, %transposed
# CHECK: linalg.batch_matmul ins(%arg4, %transposed
"""


def test_narrow_batch_matmuls_get_tiles_by_layout_and_rows(tmp_path):
    source = tmp_path / "input.mlir"
    source.write_text(SOURCE)
    pipeline = f"builtin.module(iree-preprocessing-transform-interpreter{{transform-spec-path={spec_path(NARROW_BATCH_MATMUL)}}})"
    done = subprocess.run([find_tool("iree-opt"), str(source), f"--pass-pipeline={pipeline}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    check_output(done.stdout, CHECKS, tmp_path)
