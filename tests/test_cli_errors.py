"""The `tori` command given what users get wrong: every subcommand with a bad file, a
bad path, a bad spec and a bad option answers with one `error:` line (what, where,
what to do) and exit status 2, never a traceback; and what it shows on the way
(versions, stage logs with `-v`, progress on a terminal)."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from rich.console import Console

import tori
from tori.cli import main, progress

TESTS = Path(__file__).resolve().parent
TAGGER = f"{TESTS / 'export_models.py'}:tagger"
MLP = f"{TESTS / 'report_models.py'}:small_mlp"


# One worker: the module fixture `workdir` is built once.
pytestmark = pytest.mark.xdist_group("cli_errors")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with an artifact, a real .npy input, a text file posing as .npy and a plain file."""
    root = tmp_path_factory.mktemp("cli")
    result = CliRunner().invoke(main, ["export", TAGGER, "-o", str(root / "artifact"), "--args-spec", "batch,16"])
    assert result.exit_code == 0, result.output
    np.save(root / "x.npy", np.ones((3, 16), np.float32))
    (root / "text.npy").write_text("1 2 3\n")
    (root / "afile").write_text("not a folder\n")
    return root


def _mistake(args: list[str], *expected: str, stdin: str | None = None) -> str:
    result = CliRunner().invoke(main, args, input=stdin)
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    # One error; a parse error goes on with the line and a caret under the column.
    assert lines[0].startswith("error: ") and sum("rror" in line for line in lines) == 1, result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr
    return result.stderr


def _cases(w: Path) -> list[tuple[list[str], tuple[str, ...]]]:
    return [
        # bad files
        (["opt", str(w / "missing.mlir")], ("no such MLIR file", "missing.mlir")),
        (["opt", str(w / "x.npy")], ("x.npy:1:1: unexpected character",)),
        (["run", str(w / "artifact"), "--input", str(w / "missing.npy")], ("missing.npy", "No such file")),
        (["run", str(w / "artifact"), "--input", str(w / "text.npy")], ("is not a .npy array file", "np.save(")),
        (["run", str(w / "nowhere")], ("no artifact folder",)),
        (["explore", "nosuchpkg.models:make"], ("no module named 'nosuchpkg.models'", "PYTHONPATH")),
        (["report", str(w / "missing.py") + ":make"], ("missing.py",)),
        (["profile", f"{TESTS / 'report_models.py'}:no_such_factory"], ("one of: ", "small_mlp")),
        (["export", "no_colon_here", "-o", str(w / "o")], ("MODULE:FACTORY",)),
        # bad paths
        (["opt", str(w / "x.npy"), "-o", str(w / "afile" / "out.mlir")], ("afile is not a writable folder",)),
        (["run", str(w / "artifact"), "--input", str(w / "x.npy"), "-o", str(w / "afile")], ("is a file",)),
        (["export", TAGGER, "-o", str(w / "afile" / "out")], ("--output", "afile is not a writable folder")),
        (["report", MLP, "-o", str(w / "afile" / "r.html")], ("afile is not a writable folder",)),
        (["profile", MLP, "--json", str(w / "afile" / "p.json")], ("--json",)),
        # bad specs
        (["export", TAGGER, "-o", str(w / "o"), "--args-spec", "batch:64..1,16"], ("range is empty",)),
        (["export", TAGGER, "-o", str(w / "o"), "--args-spec", "batch:a..b,16"], ("integers",)),
        (["export", TAGGER, "-o", str(w / "o"), "--args-spec", "batch,16,3"], ("3 dim(s)",)),
        (["export", TAGGER, "-o", str(w / "o"), "--args-spec", "8,16"], ("is 4 in the example",)),
        (["opt", str(w / "x.npy"), "--pipeline", "func.func(cse"], ("expected ')'",)),
        # bad options
        (["export", TAGGER, "-o", str(w / "o"), "--option", "nope=1"], ("unknown tori option 'nope'", "--option KEY=VALUE")),
        (["explore", MLP, "--option", "compile_timeout_s=-1"], ("invalid compile_timeout_s '-1'", "positive number")),
        (["report", MLP, "--option", "specialize_shapes=x"], ("invalid specialize_shapes 'x'", "an integer >= 0")),
        (["profile", MLP, "--option", "cpu=notacpu"], ("unknown cpu 'notacpu'", "skylake")),
        (["explore", MLP, "--option", "fallback"], ("is not KEY=VALUE",)),
        (["export", TAGGER, "-o", str(w / "o"), "--target", "tpu"], ("unknown target 'tpu'", "cpu")),
        (["run", str(w / "artifact"), "--entry", "decode", "--input", str(w / "x.npy")], ("no entry point 'decode'",)),
    ]


def test_every_subcommand_answers_a_mistake_with_one_error_line(workdir):
    seen = set()
    for args, expected in _cases(workdir):
        _mistake(args, *expected)
        seen.add(args[0])
    assert seen == {"opt", "run", "explore", "report", "profile", "export"}
    assert not (workdir / "o").exists()  # nothing half-written


def test_an_unbounded_dynamic_dim_exports_and_runs(workdir, tmp_path):
    for spec in ("batch,16", "batch:1..,16"):
        out = tmp_path / spec.replace(":", "_").replace(",", "_").replace(".", "")
        result = CliRunner().invoke(main, ["export", TAGGER, "-o", str(out), "--args-spec", spec])
        assert result.exit_code == 0, result.output
        manifest = tori.runtime.artifact.read_manifest(out)
        assert manifest["symbols"]["batch"]["max"] is None
    for batch in (1, 37):
        np.save(tmp_path / "big.npy", np.ones((batch, 16), np.float32))
        result = CliRunner().invoke(main, ["run", str(out), "--input", str(tmp_path / "big.npy")])
        assert result.exit_code == 0, result.output
        assert f"float32[{batch}, 8]" in result.output


def test_opt_reads_stdin_and_names_it_in_errors():
    result = CliRunner().invoke(main, ["opt", "-", "--pipeline", "cse"],
                                input="func.func @f(%a: i32) -> i32 {\n  return %a : i32\n}\n")
    assert result.exit_code == 0 and "func.func @f" in result.stdout
    line = _mistake(["opt", "-"], "<stdin>:2:", stdin="func.func @f() {\n  return %x : i32\n}\n")
    assert "undeclared SSA value" in line


def test_a_model_module_in_the_current_directory_is_found(tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(
        "import torch\n\ndef single():\n    return torch.nn.Linear(4, 2), (torch.randn(3, 4),)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    result = CliRunner().invoke(main, ["explore", "mymodels:single", "-p", "", "--seconds", "0.2", "--json"])
    assert result.exit_code == 0, result.output
    # A factory that raises: its error and where, no traceback.
    (tmp_path / "broken.py").write_text("def make():\n    raise ValueError('no weights here')\n")
    _mistake(["explore", "broken:make"], "raised ValueError: no weights here", "broken.py:2")


def test_version_names_tori_torch_torch_mlir_and_iree():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    for name in ("tori 0.1.0", "torch 2.13", "torch-mlir", "iree-base-compiler 3.", "iree-base-runtime 3."):
        assert name in result.output


def test_verbose_logs_each_stage_with_its_time(workdir, tmp_path):
    env = {**os.environ, "TORI_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "tori.cli", "-v", "export", TAGGER, "-o", str(tmp_path / "a")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    for stage in ("torch.export done in", "iree-compile (cpu) done in"):
        assert stage in done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "tori.cli", "-v", "report", MLP, "-o", str(tmp_path / "r.html")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    for stage in ("AOTAutograd and compile done in", "import to the torch dialect (Torch-MLIR) done in",
                  "tori passes done in", "iree-compile (cpu) done in", "compiled graph0_inference"):
        assert stage in done.stderr, done.stderr
    assert "tori.report: report of" in done.stderr
    done = subprocess.run([sys.executable, "-m", "tori.cli", "-v", "explore", MLP, "-p", "", "--seconds", "0.2"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "variant 0 ((no passes)): compiled in" in done.stderr, done.stderr
    assert "variant 0: median" in done.stderr
    done = subprocess.run([sys.executable, "-m", "tori.cli", "-v", "run", str(tmp_path / "a"), "--examples"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "tori.runtime: loaded" in done.stderr and "forward(float32[4, 16]) ran in" \
        in done.stderr, done.stderr
    # Without -v, quiet (the artifact's run: no compile to wait for).
    quiet = subprocess.run([sys.executable, "-m", "tori.cli", "run", str(tmp_path / "a"), "--examples"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert quiet.returncode == 0 and "ran in" not in quiet.stderr and "tori.runtime" not in quiet.stderr, \
        quiet.stderr


def test_tori_log_shows_the_stages_of_library_calls(tmp_path):
    script = ("import torch, tori\n"
              "with torch.no_grad():\n"
              "    torch.compile(torch.nn.Linear(4, 2), backend='tori')(torch.randn(2, 4))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TORI_LOG": "info", "TORI_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "tori.stage: graph0_inference: iree-compile (cpu) done in" in done.stderr
    assert done.stderr.count("iree-compile (cpu) done in") == 1  # once, not again through the root logger
    bad = subprocess.run([sys.executable, "-c", "import tori"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TORI_LOG": "loud"})
    assert bad.returncode != 0 and "unknown TORI_LOG 'loud'; one of: debug, info, warning, error" in bad.stderr


def test_progress_shows_the_latest_stage_on_a_terminal_after_the_delay():
    terminal = io.StringIO()
    console = Console(file=terminal, force_terminal=True, width=100)
    with progress("exporting m", console=console, delay_s=0.0):
        logging.getLogger("tori.stage").info("graph0: iree-compile (cpu) ...")
        import time

        time.sleep(0.5)
    assert "graph0: iree-compile (cpu) ..." in terminal.getvalue() and " s]" in terminal.getvalue()
    piped = io.StringIO()
    with progress("exporting m", console=Console(file=piped, force_terminal=False), delay_s=0.0):
        logging.getLogger("tori.stage").info("graph0: iree-compile (cpu) ...")
    assert piped.getvalue() == ""


def test_run_of_an_artifact_with_several_entry_points_asks_for_one(tmp_path):
    model = torch.nn.Linear(4, 2).eval()
    tori.export(model, entry_points={"score": (model, (torch.randn(3, 4),)),
                                     "probs": (lambda x: model(x).softmax(-1), (torch.randn(3, 4),))},
                output_dir=tmp_path / "two")
    np.save(tmp_path / "x.npy", np.ones((3, 4), np.float32))
    _mistake(["run", str(tmp_path / "two"), "--input", str(tmp_path / "x.npy")],
             "has entry points", "score", "probs", "--entry NAME")
    result = CliRunner().invoke(main, ["run", str(tmp_path / "two"), "--entry", "probs", "--input",
                                       str(tmp_path / "x.npy")])
    assert result.exit_code == 0 and "float32[3, 2]" in result.output, result.output
