"""What tori says when something is wrong, from the library: errors worded for their
context (compile, export, environment), without Dynamo's advice appended, and the
small things a newcomer trips on (option values, reprs, file modes, entry points)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import warnings

import pytest
import torch

import tori
from tori.config import Options, from_environment
from tori.errors import CompileError, OptionsError
from tori.passes import run_pipeline
from tori.runtime.artifact import load


def _eigenvalues(x):
    return torch.linalg.eigvals(x).abs()


def test_a_compile_error_reaches_the_user_without_dynamos_advice(tmp_path):
    with pytest.raises(CompileError) as raised:
        torch.compile(_eigenvalues, backend="tori", options={"fallback": "error", "repro_dir": str(tmp_path)})(
            torch.eye(3))
    text = str(raised.value)
    assert "general (non-symmetric) matrix have no formulation in tori" in text
    assert "TORCHDYNAMO_VERBOSE" not in text and "reporting a bug to PyTorch" not in text
    assert "what to do: run with options={'fallback': 'eager'}" in text and "report the repro file" in text
    # The torch-stage repro reproduces the refusal: it fails, saying the same.
    done = subprocess.run(raised.value.command, shell=True, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "general (non-symmetric) matrix have no formulation in tori" in done.stderr


def test_an_export_error_says_what_applies_to_export(tmp_path):
    class Poisson(torch.nn.Module):  # tori draws no seeded Poisson samples
        def forward(self, x):
            return torch.poisson(x)

    with pytest.raises(CompileError) as raised:
        tori.export(torch.nn.Sequential(torch.nn.BatchNorm1d(4)).train(), (torch.ones(3, 4),),
                    output_dir=tmp_path / "a")
    assert "export the model in eval() mode" in str(raised.value)
    assert "options={" not in str(raised.value) and "what to do" not in str(raised.value)
    with pytest.raises(CompileError) as raised:
        tori.export(Poisson(), (torch.ones(3),), output_dir=tmp_path / "b")
    text = str(raised.value)
    assert "aten.poisson" in text and "options={'fallback'" not in text
    assert "what to do: an exported module has no eager fallback, so every op must compile" in text
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_export_of_an_unbounded_dim_writes_null_and_no_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        path = tori.export(torch.nn.Linear(8, 4), (torch.randn(3, 8),), output_dir=tmp_path / "a",
                           dynamic_shapes=({0: torch.export.Dim("batch")},), external_weights=True)
    manifest = tori.runtime.artifact.read_manifest(path)
    assert manifest["symbols"]["batch"]["max"] is None
    # Every file of the artifact has the same mode (IREE writes its archive 0640).
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.iterdir() if p.is_file()}
    assert len(set(modes.values())) == 1, modes
    loaded = load(path)
    with pytest.raises(AttributeError, match="has no entry point 'decode'; it has: forward"):
        loaded.decode
    assert loaded.forward(torch.randn(50, 8).numpy()).shape == (50, 4)


@pytest.mark.parametrize("options, message", [
    ({"specialize_shapes": "x"}, "invalid specialize_shapes 'x'; expected an integer >= 0"),
    ({"compile_timeout_s": -1}, "invalid compile_timeout_s -1; expected a positive number of seconds"),
    ({"compile_timeout_s": "soon"}, "invalid compile_timeout_s 'soon'"),
    ({"cache_max_bytes": "lots"}, "invalid cache_max_bytes 'lots'; expected a positive number of bytes"),
    ({"dump_dir": 5}, "invalid dump_dir 5; expected a path"),
    ({"fallback": "raise"}, "unknown fallback 'raise'; one of: eager, error"),
    ({"cpu": "notacpu"}, "unknown cpu 'notacpu'; one of: host, "),
])
def test_an_option_value_error_is_worded_for_its_kind(options, message):
    with pytest.raises(OptionsError) as raised:
        Options.from_mapping(options)
    assert message in str(raised.value)
    for broken in ("shapess", "_ss", "bytess", "unknown compile_timeout_s"):
        assert broken not in str(raised.value)


def test_an_environment_value_error_names_its_variable():
    with pytest.raises(OptionsError, match=r"environment variable TORI_FALLBACK='raise': unknown fallback 'raise'"):
        from_environment({"TORI_FALLBACK": "raise"})
    with pytest.raises(OptionsError, match="TORI_SPECIALIZE_SHAPES='-3'"):
        from_environment({"TORI_SPECIALIZE_SHAPES": "-3"})
    done = subprocess.run([sys.executable, "-c", "import torch, tori; torch.compile(lambda x: x, backend='tori')"
                           "(torch.ones(2))"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TORI_FALLBACK": "raise"})
    assert done.returncode != 0 and "TORI_FALLBACK='raise'" in done.stderr


def test_a_pass_option_of_the_wrong_type_reads_well():
    from tori.frontend.importer import new_context
    from torch_mlir import ir

    module = ir.Module.parse("func.func @f() { return }", context=new_context())
    with pytest.raises(OptionsError) as raised:
        run_pipeline(module, "tori-fold-constants{limit=many}")
    assert "takes an integer, not 'many'" in str(raised.value)


def test_pass_runs_print_briefly():
    passes = [run for runs in tori.compiler.inspect(lambda x: x.exp() + 1, torch.randn(4), stages=["tori"]).passes
              for run in (runs if isinstance(runs, list) else [runs])]
    assert passes and all(len(repr(run)) < 120 for run in passes)
    assert "ms, changed=" in repr(passes[0])


def test_a_factory_listing_names_only_the_modules_own_functions():
    from tori.tools.loading import load_factory

    with pytest.raises(OptionsError) as raised:
        load_factory(f"{os.path.dirname(__file__)}/../benchmarks/examples.py:nope")
    text = str(raised.value)
    assert "one of: cnn_bn, gpt2_decoder" in text and "Path" not in text and ".pys" not in text
