"""Stage dumps, tori.compiler.inspect, and the `tori opt` and `tori explore` commands."""

import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import tori
from tori.cli import main
from tori.cache import compile_key
from tori.targets.build import in_process_flags
from tori.testing import assert_matches_eager

TESTS = Path(__file__).resolve().parent


def with_constant(x):
    return torch.relu(x) + torch.arange(64.0) * 2


def test_inspect_returns_stage_texts_without_building_a_module():
    before = tori.counters.snapshot()
    stages = tori.compiler.inspect(with_constant, torch.randn(2, 64))
    assert list(stages) == ["dynamo", "aten", "torch", "tori", "iree"]
    assert "torch.arange" in stages["dynamo"] and "torch.ops.aten.arange" in stages["aten"]
    assert "torch.aten.arange" in stages["torch"] and "torch.aten.arange" not in stages["tori"]
    assert stages["iree"].startswith("// iree-compile") and "tori." not in stages["iree"].split("\n", 1)[1]
    # The folded 64-element constant's blob is elided by MLIR's printer, and kept on request.
    assert "dense_resource<__elided__> : tensor<64xf32>" in stages["tori"] and "1.260000e+02" not in stages["tori"]
    kept = tori.compiler.inspect(with_constant, torch.randn(2, 64), stages=["tori"], keep_large_constants=True)
    assert "dense<[0.000000e+00, 2.000000e+00" in kept["tori"] and "1.260000e+02]> : tensor<64xf32>" in kept["tori"]
    assert tori.counters.since(before).compiled_graphs == 0
    only = tori.compiler.inspect(with_constant, torch.randn(2, 64), stages=["torch"])
    assert list(only) == ["torch"]


def test_inspect_sees_every_graph_after_a_graph_break():
    from report_models import with_graph_break

    model, inputs = with_graph_break()
    stages = tori.compiler.inspect(model, *inputs, stages=["torch"])
    assert len(stages.graphs) == 2
    # The second graph's sin is decomposed (tori.frontend.decomp.trig): no relu there.
    assert "torch.aten.relu" in stages.graphs[0]["torch"] and "torch.aten.relu" not in stages.graphs[1]["torch"]


def test_dump_dir_index_links_stages_guards_passes_and_content_hash(tmp_path):
    assert_matches_eager(with_constant, torch.randn(2, 64),
                         options={"dump_dir": str(tmp_path), "dump_iree_phases": True})
    (graph_dir,) = tmp_path.iterdir()
    index = json.loads((graph_dir / "index.json").read_text())
    assert [s["stage"] for s in index["stages"]] == [
        "dynamo", "aten", "torch", "tori.02.tori-fold-constants", "tori", "iree-input", "iree", "vmfb"]
    assert all((graph_dir / s["file"]).is_file() for s in index["stages"])
    assert "L['x']: TENSOR_MATCH" in index["guards"]
    fold = next(p for p in index["passes"] if p["step"] == "tori-fold-constants")
    assert fold["changed"] and fold["file"] == "03-tori.02.tori-fold-constants.mlir" and fold["seconds"] > 0
    assert re.fullmatch(r"[0-9a-f]{64}", index["content_hash"])
    assert "module.6.flow.mlir" in index["iree_phases"]
    assert "flow.dispatch" in (graph_dir / "iree-phases" / "module.6.flow.mlir").read_text()
    # Large constants are elided in the stage files, and kept on request.
    assert "dense_resource<__elided__> : tensor<64xf32>" in (graph_dir / "04-tori.mlir").read_text()
    tori.compiler.reset()
    keep = tmp_path / "keep"
    assert_matches_eager(with_constant, torch.randn(2, 64), options={"dump_dir": str(keep), "dump_large_constants": True})
    (kept,) = keep.iterdir()
    assert "1.260000e+02]> : tensor<64xf32>" in (kept / "04-tori.mlir").read_text()
    # The hash is the compile cache's key: the IR after tori's passes (kept whole in this
    # dump), the target's flags (the code generation strategy's and the in-process
    # module's included) and CPU, and the versions; the key the compile used.
    options = tori.compiler.config.options()
    record = tori.last_compile().graphs[0]
    content_hash = json.loads((kept / "index.json").read_text())["content_hash"]
    assert content_hash == record.modules_key
    assert content_hash == compile_key((kept / "04-tori.mlir").read_text(), options, record.codegen,
                                       in_process_flags(options))


@pytest.fixture(scope="module")
def torch_mlir_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("opt") / "model.torch.mlir"
    path.write_text(tori.compiler.inspect(lambda x: (x + torch.ones(4) * 3).exp(), torch.randn(4), stages=["torch"])["torch"])
    return path


def test_opt_runs_a_pipeline_with_ir_after_change_and_timing(torch_mlir_file):
    result = CliRunner().invoke(main, ["opt", str(torch_mlir_file), "--pipeline",
                                       "tori-fold-constants, func.func(canonicalize), cse",
                                       "--print-ir-after-change", "--timing"])
    assert result.exit_code == 0, result.output
    assert "// -----// IR Dump After tori-fold-constants //----- //" in result.stderr
    assert "IR Dump After cse" not in result.stderr  # cse changed nothing
    assert re.search(r"tori-fold-constants\s*│\s*[\d.]+\s*│ yes", result.stderr)
    assert re.search(r"cse\s*│\s*[\d.]+\s*│ no", result.stderr) and "func.func(canonicalize)" in result.stderr
    assert "torch.aten.ones" not in result.stdout and "torch.aten.exp" in result.stdout


def test_opt_lists_passes_with_descriptions():
    result = CliRunner().invoke(main, ["opt", "--list-passes"])
    assert result.exit_code == 0
    lines = {line.split()[0]: line for line in result.output.splitlines() if line.startswith("  ")}
    assert "Evaluate torch-dialect ops on constants" in lines["tori-fold-constants"]
    assert "Canonicalize operations" in lines["canonicalize"]
    assert "torch-reduce-op-variants" in lines and len(lines) > 100


@pytest.mark.parametrize("pipeline, message", [
    ("func.func(canonicalise)", "closest registered names: canonicalize"),
    ("tori-fold-constant", "closest registered names: tori-fold-constants"),
    ("func.func(cse", "expected ')' at column 13"),
])
def test_opt_bad_pipeline_is_one_clear_error(torch_mlir_file, pipeline, message):
    result = CliRunner().invoke(main, ["opt", str(torch_mlir_file), "--pipeline", pipeline])
    assert result.exit_code == 2 and message in result.stderr
    assert "Traceback" not in result.output


def test_opt_unparseable_file_names_line_and_column(tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text("func.func @f(%a: i32) -> i32 {\n  %0 = arith.addi %a, %b : i32\n  return %0 : i32\n}\n")
    result = CliRunner().invoke(main, ["opt", str(bad), "--pipeline", "cse"])
    assert result.exit_code == 2
    assert f"{bad}:2:23: use of undeclared SSA value name" in result.stderr
    assert "\n                      ^" in result.stderr


def test_explore_compares_pipelines_against_eager_as_json():
    result = CliRunner().invoke(main, [
        "explore", f"{TESTS / 'report_models.py'}:small_mlp", "-p", "tori-fold-constants", "-p", "",
        "--iree-flags", "", "--iree-flags", "--iree-opt-level=O0", "--seconds", "0.4", "--json"])
    assert result.exit_code == 0, result.output
    first, second = json.loads(result.stdout)["variants"]
    assert second["variant"] == {"pipeline": "", "iree_flags": ["--iree-opt-level=O0"],
                                 "label": "(no passes) | --iree-opt-level=O0"}
    for variant in (first, second):
        assert variant["correct"] and variant["max_error"] < 1e-4 and variant["fell_back"] is None
        assert variant["dispatches"] >= 2 and variant["median_ms"] > 0 and variant["compile_s"] > 0
    assert first["ratio"] == 1.0 and second["ratio"] == pytest.approx(second["median_ms"] / first["median_ms"])


def test_explore_rejects_an_unknown_pass_before_compiling():
    result = CliRunner().invoke(main, ["explore", f"{TESTS / 'report_models.py'}:small_mlp", "-p", "cse", "-p", "csee"])
    assert result.exit_code == 2 and "closest registered names: cse" in result.stderr
