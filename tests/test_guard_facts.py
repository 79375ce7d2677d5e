"""Guard facts end to end: real Dynamo graphs with dynamic shapes carry their
ShapeEnv's facts into the `tori` stage, assume_constant_result literals keep their
origin, tori-specialize-guards hands them to IREE, and IREE never sees a tori op."""

import pytest
import torch
from torch_mlir import ir

import tori
import tori.targets.build as build_module
from tori.frontend.importer import new_context
from tori.stages import Stage
from tori.testing import assert_matches_eager


@pytest.fixture
def iree_inputs(monkeypatch):
    """The modules handed to iree-compile in this test, parsed back from their bytecode."""
    seen: list[str] = []
    real = build_module.run_iree_compile

    def capture(bytecode, *args, **kwargs):
        seen.append(str(ir.Module.parse(bytecode, context=new_context())))
        return real(bytecode, *args, **kwargs)

    monkeypatch.setattr(build_module, "run_iree_compile", capture)
    with tori.compiler.config.patch(cache=False):  # a cache hit would hand iree-compile nothing
        yield seen


def _blocks_of_8(x, y):
    # view(-1, 8) makes Dynamo guard on Eq(Mod(s, 8), 0): a divisibility fact.
    return x.view(-1, 8).sum(1) * 2 + y.sum()


def test_divisibility_and_range_facts_reach_the_tori_stage(iree_inputs):
    assert_matches_eager(_blocks_of_8, torch.randn(64), torch.randn(5, 3), dynamic=True, calls=2)
    tori_ir = tori.last_compile().stages[Stage.TORI]
    assert '"tori.dim_facts"(%arg1) {dim = 0 : i64, divisor = 8 : i64, max = "inf", min = 16 : i64}' in tori_ir
    assert '"tori.int_facts"(%arg0) {divisor = 8 : i64, max = "inf", min = 16 : i64}' in tori_ir
    assert tori_ir.count('"tori.dim_facts"(') == 3  # x's dim 0, y's dims 0 and 1
    assert iree_inputs and all("tori." not in text for text in iree_inputs)


def test_other_sizes_of_the_same_graph_run_compiled_and_match_eager(iree_inputs):
    compiled = torch.compile(_blocks_of_8, backend="tori", dynamic=True, options={"fallback": "error"})
    for n, m in ((64, 5), (24, 7), (8 * 37, 2)):
        x, y = torch.randn(n), torch.randn(m, 3)
        torch.testing.assert_close(compiled(x, y), _blocks_of_8(x, y))
    assert tori.last_compile().forward.compiled is not None


@torch.compiler.assume_constant_result
def _table():
    return torch.arange(4.0)


def _uses_table(x):
    return x * _table() + 1


def test_assume_constant_result_origin_shows_in_the_tori_stage(iree_inputs):
    assert_matches_eager(_uses_table, torch.randn(3, 4), dynamic=True)
    tori_ir = tori.last_compile().stages[Stage.TORI]
    assert f'function = "{__name__}._table"' in tori_ir
    assert "test_guard_facts.py:" in tori_ir  # the call site
    assert iree_inputs and all("tori." not in text for text in iree_inputs)


def test_arithmetic_on_an_assumed_constant_folds_through_its_origin():
    def doubled_table(x):
        return x + _table() * 2 + _table().sum()

    assert_matches_eager(doubled_table, torch.randn(4), options={"pipeline": "tori-fold-constants"})
    record = tori.last_compile()
    torch_ir, tori_ir = record.stages[Stage.TORCH], record.stages[Stage.TORI]
    assert "tori.assumed_constant" in torch_ir
    assert "torch.aten.sum" in torch_ir and "torch.aten.sum" not in tori_ir


def test_the_empty_pipeline_still_lowers_the_dialect(iree_inputs):
    assert_matches_eager(_blocks_of_8, torch.randn(32), torch.randn(2, 3), dynamic=True, options={"pipeline": ""})
    assert "tori.dim_facts" in tori.last_compile().stages[Stage.TORI]
    assert iree_inputs and all("tori." not in text for text in iree_inputs)


def test_specialize_guards_binds_shapes_for_iree(iree_inputs):
    assert_matches_eager(_blocks_of_8, torch.randn(64), torch.randn(5, 3), dynamic=True, calls=2,
                         options={"pipeline": "tori-specialize-guards, tori-fold-constants"})
    tori_ir = tori.last_compile().stages[Stage.TORI]
    assert 'torch.symbolic_int "s0" {min_val = 2, max_val = 9223372036854775807}' in tori_ir
    assert "affine_map<()[s0] -> (s0 * 8)>" in tori_ir
    assert any("torch.bind_symbolic_shape" in text and "tori." not in text for text in iree_inputs)


def test_a_size_pinned_by_a_guard_is_static_already_and_carries_no_range(iree_inputs):
    # The ShapeEnv's replacement (y's size -> 6) reaches AOTAutograd's fake tensors:
    # the argument is imported static, and only x's free sizes get facts.
    def pinned(x, y):
        torch._check(y.shape[0] == 6)
        return x.sum(0) + y

    assert_matches_eager(pinned, torch.randn(5, 6), torch.randn(6), dynamic=True,
                         options={"pipeline": "tori-specialize-guards"})
    tori_ir = tori.last_compile().stages[Stage.TORI]
    assert "%arg0: !torch.vtensor<[6],f32>" in tori_ir
    assert '"tori.dim_facts"(%arg0)' not in tori_ir
    assert '"tori.dim_facts"(%arg2) {dim = 0 : i64' in tori_ir
