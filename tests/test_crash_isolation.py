"""iree-compile crashes (it aborts or dies of a signal on some valid input) are
contained: iree-compile runs as a child process, its death becomes a CompileError
with a repro file, and the user's interpreter goes on."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tori.config import Options
from tori.errors import CompileError
from tori.frontend.compile_graph import compile_graph
from tori.frontend.records import GraphRecord

# A matrix product with an empty inner dimension, imported without tori's
# decompositions: IREE 3.13's AnnotateDispatches pass divides by zero (SIGFPE).
EMPTY_INNER_MM = """
func.func @main(%a: !torch.vtensor<[5,0],f32>, %b: !torch.vtensor<[0,10],f32>) -> !torch.vtensor<[5,10],f32> {
  %0 = torch.aten.mm %a, %b : !torch.vtensor<[5,0],f32>, !torch.vtensor<[0,10],f32> -> !torch.vtensor<[5,10],f32>
  return %0 : !torch.vtensor<[5,10],f32>
}
"""


def test_a_crashing_iree_compile_is_a_compile_error():
    from torch_mlir import ir

    from tori.frontend.importer import new_context, to_bytecode
    from tori.targets import Target
    from tori.targets.iree_compile import IreeInvocation, compile_flags, run_iree_compile

    with new_context():
        module = ir.Module.parse(EMPTY_INNER_MM)
        bytecode = to_bytecode(module)
    invocation = IreeInvocation(tuple(compile_flags(Target.CPU)))
    with pytest.raises(CompileError) as caught:
        run_iree_compile(bytecode, invocation, graph="empty_mm", timeout_s=120)
    assert "crashed with signal" in caught.value.reason
    assert caught.value.stage == "iree"


def test_a_graph_that_crashes_iree_compile_raises_with_its_repro(tmp_path):
    gm = make_fx(torch.mm)(torch.randn(5, 0), torch.randn(0, 10))
    record = GraphRecord("empty_mm", "inference")
    with pytest.raises(CompileError) as caught:
        compile_graph(gm, Options(repro_dir=tmp_path, pipeline=""), record)
    error = caught.value
    assert "crashed with signal" in error.reason
    assert error.repro is not None and error.repro.exists() and "torch.aten.mm" in error.repro.read_text()
    assert "iree-compile" in error.command
    assert record.error is error

