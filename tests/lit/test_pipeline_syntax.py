"""Textual pipelines in MLIR's syntax: tori passes mixed with upstream ones, anchors, options."""

import textwrap

import pytest
from torch_mlir import ir

import tori
from tori.errors import OptionsError
from tori.frontend.importer import new_context
from tori.passes import PassError, PassStep, parse_pipeline, register_pass, run_pipeline, validate_pipeline

PIPELINE = "builtin.module(func.func(tori-fold-constants, canonicalize), cse)"

TWO_FUNCTIONS = """
    func.func @first(%arg0: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
      %0 = torch.vtensor.literal(dense<[1.0, 2.0]> : tensor<2xf32>) : !torch.vtensor<[2],f32>
      %int2 = torch.constant.int 2
      %1 = torch.aten.mul.Scalar %0, %int2 : !torch.vtensor<[2],f32>, !torch.int -> !torch.vtensor<[2],f32>
      %int1 = torch.constant.int 1
      %2 = torch.aten.add.Tensor %arg0, %1, %int1 : !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>, !torch.int -> !torch.vtensor<[2],f32>
      return %2 : !torch.vtensor<[2],f32>
    }
    func.func @second() -> !torch.vtensor<[2],f32> {
      %0 = torch.vtensor.literal(dense<[3.0, 4.0]> : tensor<2xf32>) : !torch.vtensor<[2],f32>
      %1 = torch.aten.neg %0 : !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
      return %1 : !torch.vtensor<[2],f32>
    }
"""


def test_parse_nested_anchors_and_options():
    steps = parse_pipeline("builtin.module(func.func(tori-fold-constants{limit=8}, canonicalize{max-iterations=2 region-simplify=disabled}), cse)")
    assert steps == [
        PassStep("tori-fold-constants", ("builtin.module", "func.func"), {"limit": "8"}, "limit=8"),
        PassStep("canonicalize", ("builtin.module", "func.func"),
                 {"max-iterations": "2", "region-simplify": "disabled"}, "max-iterations=2 region-simplify=disabled"),
        PassStep("cse", ("builtin.module",)),
    ]
    assert steps[0].text() == "func.func(tori-fold-constants{limit=8})"
    assert steps[0].text(with_root=True) == "builtin.module(func.func(tori-fold-constants{limit=8}))"


def test_a_bare_list_runs_on_the_module():
    assert parse_pipeline("tori-fold-constants, func.func(cse)") == [
        PassStep("tori-fold-constants"), PassStep("cse", ("builtin.module", "func.func"))]
    assert parse_pipeline("") == [] and parse_pipeline("  ") == []


def test_tori_and_upstream_passes_run_in_every_function(filecheck):
    filecheck(TWO_FUNCTIONS, """
        # CHECK-LABEL: func.func @first
        # CHECK:         torch.vtensor.literal(dense<[2.000000e+00, 4.000000e+00]>
        # CHECK-NOT:     torch.aten.mul.Scalar
        # CHECK:         torch.aten.add.Tensor %arg0
        # CHECK-LABEL: func.func @second
        # CHECK:         torch.vtensor.literal(dense<[-3.000000e+00, -4.000000e+00]>
        # CHECK-NOT:     torch.aten.neg
    """)


def test_an_anchor_limits_a_pass_to_its_ops(filecheck):
    # Under an anchor that matches nothing, the tori pass changes nothing.
    filecheck(TWO_FUNCTIONS, """
        # CHECK-LABEL: func.func @first
        # CHECK:         torch.aten.mul.Scalar
        # CHECK-LABEL: func.func @second
        # CHECK:         torch.aten.neg
    """, pipeline="builtin.module(util.func(tori-fold-constants))")


def test_a_tori_pass_option_reaches_the_pass(filecheck):
    # limit=1 keeps results of two elements from folding.
    filecheck(TWO_FUNCTIONS, """
        # CHECK-LABEL: func.func @first
        # CHECK:         torch.aten.mul.Scalar
        # CHECK-LABEL: func.func @second
        # CHECK:         torch.aten.neg
    """, pipeline="func.func(tori-fold-constants{limit=1})")


@pytest.mark.parametrize("pipeline, named", [
    ("tori-no-such-pass", "tori-no-such-pass"),
    ("func.func(tori-fold-constants{nonsense=1})", "nonsense"),
    ("tori-fold-constants{limit=many}", "many"),
    ("canonicalize{max-iterations=x}", "canonicalize"),
    ("func.func(cse", "expected ')'"),
    ("tori-fold-constants{limit=1", "unclosed"),
    ("cse,, canonicalize", "expected a pass or op name"),
])
def test_bad_pipelines_are_rejected_naming_the_problem(pipeline, named):
    with pytest.raises(OptionsError) as raised:
        validate_pipeline(pipeline)
    assert named in str(raised.value)


def test_a_bad_pipeline_is_rejected_before_compiling():
    with pytest.raises(OptionsError, match="tori-no-such-pass"):
        tori.Options.from_mapping({"pipeline": "builtin.module(func.func(tori-no-such-pass))"})


def test_torch_mlir_passes_mix_with_tori_passes(filecheck):
    filecheck(TWO_FUNCTIONS, """
        # CHECK-LABEL: func.func @first
        # CHECK-NOT:     torch.aten.mul.Scalar
    """, pipeline="func.func(torch-reduce-op-variants), tori-fold-constants")


@register_pass("test-signals-failure")
def _signals_failure(op, pass_):
    """Test pass: fails on every op it runs on."""
    pass_.signal_pass_failure()


def test_a_failing_nested_pass_is_named_with_its_anchor_and_input():
    module = ir.Module.parse(textwrap.dedent(TWO_FUNCTIONS), context=new_context())
    before = str(module)
    with pytest.raises(PassError) as raised:
        run_pipeline(module, "tori-fold-constants, func.func(test-signals-failure)")
    error = raised.value
    assert error.pass_name == "test-signals-failure" and error.step == "func.func(test-signals-failure)"
    assert error.stage == "tori" and "torch.aten.mul.Scalar" not in error.ir_before != before


def test_each_pass_reports_time_and_whether_it_changed_the_ir():
    module = ir.Module.parse(textwrap.dedent(TWO_FUNCTIONS), context=new_context())
    seen = []
    runs = run_pipeline(module, "func.func(tori-fold-constants), cse", on_pass=seen.append)
    assert runs == seen and [run.step.name for run in runs] == ["tori-fold-constants", "cse"]
    assert [run.changed for run in runs] == [True, False]
    assert all(run.seconds >= 0 for run in runs) and runs[0].ir_after == str(module)
