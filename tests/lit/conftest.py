"""FileCheck fixtures for IR tests: MLIR in, a pipeline run over it, FileCheck on the result."""

import textwrap

import pytest
from filecheck.matcher import Matcher
from filecheck.options import Options as FileCheckOptions
from torch_mlir import ir

from tori.frontend.importer import new_context
from tori.passes import run_pipeline


def run_ir(source: str, pipeline: str) -> str:
    """`source` (torch-dialect MLIR) after `pipeline`, verified."""
    module = ir.Module.parse(textwrap.dedent(source), context=new_context())
    run_pipeline(module, pipeline)
    assert module.operation.verify()
    return str(module)


def check_output(output: str, checks: str, folder) -> None:
    """FileCheck `checks` against `output` (files written under `folder`)."""
    checks_file, output_file = folder / "checks", folder / "output.mlir"
    checks_file.write_text(textwrap.dedent(checks))
    output_file.write_text(output)
    matcher = Matcher.from_opts(FileCheckOptions(match_filename=str(checks_file), input_file=str(output_file)))
    assert matcher.run() == 0, f"FileCheck failed (report in the captured stderr) on:\n{output}"


@pytest.fixture
def filecheck(tmp_path, request):
    """check(source, checks, pipeline=...): run `pipeline` (default: the test module's
    PIPELINE) over `source`, then FileCheck `checks` against the result."""

    def check(source: str, checks: str, pipeline: str | None = None) -> str:
        output = run_ir(source, pipeline if pipeline is not None else request.module.PIPELINE)
        check_output(output, checks, tmp_path)
        return output

    return check
