"""The self-contained GPU check (benchmarks/gpu_bundle.py, benchmarks/gpu_check.sh):
the bundle builds in one command under the 64 MiB a call to the GPU machine carries,
its CUDA modules are sm_90 and sm_80 PTX, and its dry run passes here, the way it runs
there: tori's runtime from the bundle, with neither Torch-MLIR nor IREE's compiler
importable (the GPU machine has neither)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tori.targets.inspect import inspect_vmfb

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 64 << 20
REAL = {"timm_test_efficientnet", "transformers_bert_tiny"}
sys.path.insert(0, str(ROOT / "benchmarks"))
from models import MODELS  # noqa: E402

EXPECTED = len(MODELS) + len(REAL)  # every benchmark model, and the real ones

# Imported at interpreter start (sitecustomize): what the GPU machine lacks cannot be imported.
BLOCKER = textwrap.dedent("""
    import sys
    class _Missing:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "torch_mlir" or name.startswith("iree.compiler"):
                raise ImportError(f"{name} is not installed on the GPU machine")
    sys.meta_path.insert(0, _Missing())
""")


# CI builds the bundle of one benchmark model and one real architecture; `make
# test-extended` the whole bundle (every model, the size that must stay under 64 MiB).
CASES = [pytest.param(("mlp", "transformers_bert_tiny"), id="two-models"),
         pytest.param(None, id="every-model", marks=pytest.mark.extended)]


@pytest.mark.parametrize("names", CASES)
def test_the_gpu_check_bundle_builds_under_64_mib_and_its_dry_run_passes(tmp_path, names):
    bundle = tmp_path / "gpu-check"
    chosen = ["--models", ",".join(names)] if names else []
    built = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_bundle.py"), "--out", str(bundle), *chosen],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    assert size < LIMIT and f"{size / (1 << 20):.1f} MiB" in built.stdout
    manifest = json.loads((bundle / "bundle.json").read_text())
    expected = len(names) if names else EXPECTED
    assert set(names or REAL) <= set(manifest["models"]) and len(manifest["models"]) == expected
    assert [w for w in manifest["wheels"] if "cp312" in w and w.startswith("iree_base_runtime-3.13.0")]
    for name, model in manifest["models"].items():
        assert set(model["artifacts"]) == {"sm_90", "sm_80"} and model["eager"], name
        for arch, folder in model["artifacts"].items():
            contents = inspect_vmfb((bundle / folder / "cuda.vmfb").read_bytes())
            assert contents.formats and all(f.startswith("cuda-nvptx") for f in contents.formats), (name, contents)
            assert contents.gpu_archs == (arch,) and contents.entry_points, (name, arch, contents)
        # The first architecture's artifact also has the cpu module of the dry run.
        cpu = inspect_vmfb((bundle / model["artifacts"]["sm_90"] / "cpu.vmfb").read_bytes())
        assert cpu.formats and all(f.startswith("embedded-elf") for f in cpu.formats) and cpu.executables, (name, cpu)

    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    environ = {**os.environ, "PY": sys.executable, "PYTHONPATH": str(blocker)}
    result = tmp_path / "dry-run.json"
    ran = subprocess.run(["bash", str(bundle / "gpu_check.sh"), "--dry-run", str(result)], env=environ,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "carried wheel iree_base_runtime-3.13.0-cp312" in ran.stdout and "installs for Python 3.12" in ran.stdout
    summary = json.loads(result.read_text())
    assert summary["device"] == "cpu" and summary["artifacts"] == expected and summary["failed"] == []
    for row in summary["rows"]:
        assert row["ok"] and row["numpy"]["max_error"] <= 2e-3 and row["dlpack"]["max_error"] <= 2e-3, row
        assert row["dlpack"]["on"] == "cpu" and row["eager"]["ms"] > 0 and row["eager"]["max_error"] <= 2e-3, row
    # tori's runtime came from the bundle.
    assert Path(summary["tori_runtime"]).resolve().is_relative_to(bundle.resolve() / "python"), summary["tori_runtime"]
