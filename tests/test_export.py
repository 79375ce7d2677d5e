"""tori.export and tori.runtime.load end to end: real torch.export, Torch-MLIR, iree-compile,
IREE runtime, iree-run-module and the system C compiler; results compared with eager."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import tori
from tori.errors import ArtifactError, CompileError
from tori.runtime import artifact as fmt

from system_packages import missing

sys.path.insert(0, str(Path(__file__).parent))
import export_models  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _vulkan_device() -> bool:
    import iree.runtime as rt

    try:
        return bool(rt.get_driver("vulkan").query_available_devices())
    except Exception:
        return False


# One worker: the module fixture `exported` is built once.
pytestmark = pytest.mark.xdist_group("export")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The Tagger model exported for CPU and Vulkan with external weights and a dynamic batch."""
    export_models.CONSTANT_CALLS.clear()
    export_models.EXPORTING_SEEN.clear()
    model, (x,) = export_models.tagger()
    batch = torch.export.Dim("batch", min=2, max=32)
    path = tori.export(model, (x,), dynamic_shapes=({0: batch},), targets=("cpu", "vulkan"),
                       output_dir=tmp_path_factory.mktemp("export") / "tagger", external_weights=True)
    return model, path


def _eager(model, *inputs):
    with torch.no_grad():
        return model(*inputs)


def test_manifest_describes_the_artifact(exported):
    model, path = exported
    manifest = fmt.read_manifest(path)
    assert sorted(manifest["files"]) == ["cpu.vmfb", "examples/forward/input_0.npy", "examples/forward/output_0.npy",
                                         "parameters.irpa", "vulkan.vmfb"]
    forward = manifest["entry_points"]["forward"]
    assert forward["tracer"] == "torch.export (non-strict)"
    assert forward["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", 16]}]
    assert forward["outputs"] == [{"name": "output", "dtype": "float32", "shape": ["batch", 8]}]
    assert manifest["symbols"] == {"batch": {"min": 2, "max": 32}}
    assert set(manifest["versions"]) >= {"tori", "torch", "torch_mlir", "iree_compiler", "iree_runtime"}
    assert manifest["pipeline"] == tori.compiler.config.options().tori_pipeline  # the cpu target's default
    # Parameters and buffers are in the archive; the assume_constant_result values are not.
    assert sorted(manifest["parameters"]["entries"]) == ["embed.bias", "embed.weight", "head.bias", "head.weight",
                                                         "temperature"]
    assert manifest["content_hash"] == fmt.content_hash(manifest)


def test_assume_constant_result_is_evaluated_at_export(exported):
    model, path = exported
    # `offsets` ran once, eagerly, for the reference; the non-strict trace used its value.
    assert export_models.CONSTANT_CALLS == [True]
    assert export_models.EXPORTING_SEEN and all(export_models.EXPORTING_SEEN)
    assert not tori.compiler.is_exporting()
    x = torch.randn(6, 16)
    expected = _eager(model, x)
    loaded = tori.runtime.load(path)
    np.testing.assert_allclose(loaded(x.numpy()), expected.numpy(), rtol=1e-5, atol=1e-5)
    # The folded value does not follow what `shift` reads after export; eager does.
    model.bias_source[0] = 3.0
    try:
        assert not torch.allclose(_eager(model, x), expected)
        np.testing.assert_allclose(loaded(x.numpy()), expected.numpy(), rtol=1e-5, atol=1e-5)
    finally:
        model.bias_source[0] = 0.5


@pytest.mark.parametrize("device", ["cpu", "local-task", "vulkan"])
def test_load_matches_eager(exported, device):
    if device == "vulkan" and not _vulkan_device():
        missing("VULKAN")
    model, path = exported
    loaded = tori.runtime.load(path, device=device)
    for batch in (2, 9, 32):
        x = torch.randn(batch, 16)
        np.testing.assert_allclose(loaded(x.numpy()), _eager(model, x).numpy(), rtol=1e-5, atol=1e-5)
    assert loaded.driver == ("vulkan" if device == "vulkan" else "local-sync" if device == "cpu" else device)


def test_runs_without_torch(exported):
    """A fresh interpreter in which importing torch (or a compiler) fails loads and runs the artifact."""
    _, path = exported
    script = textwrap.dedent(f"""
        import sys
        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "torch_mlir", "functorch") or name.startswith("iree.compiler"):
                    raise ImportError(f"{{name}} is not installed here")
        sys.meta_path.insert(0, Refuse())
        import numpy as np
        import tori.runtime
        artifact = tori.runtime.load({str(path)!r})
        folder = {str(path / "examples" / "forward")!r}
        got = artifact.forward(np.load(folder + "/input_0.npy"))
        expected = np.load(folder + "/output_0.npy")
        assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, got.shape)
        print("max_error", float(np.abs(got - expected).max()))
        assert not any(m.split(".")[0] in ("torch", "torch_mlir") for m in sys.modules), "torch was imported"
        try:
            import torch
        except ImportError:
            print("torch unavailable")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch unavailable" in done.stdout
    error = float(re.search(r"max_error (\S+)", done.stdout).group(1))
    assert error < 1e-5


def _printed_values(stdout: str) -> list[np.ndarray]:
    """The arrays iree-run-module prints, e.g. `2x3xf32=[1 2 3][4 5 6]`."""
    found = []
    for line in stdout.splitlines():
        match = re.match(r"^([\dx]+)x(\w+)=(.*)$", line.strip())
        if match:
            shape = [int(d) for d in match.group(1).split("x")]
            numbers = re.findall(r"[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan)", match.group(3))
            found.append(np.array([float(n) for n in numbers]).reshape(shape))
    return found


def test_iree_run_module_runs_the_artifact(exported, tmp_path):
    model, path = exported
    x = torch.randn(3, 16)
    np.save(tmp_path / "x.npy", x.numpy())
    done = subprocess.run(
        [str(BIN / "iree-run-module"), f"--module={path / 'cpu.vmfb'}", "--device=local-task",
         f"--parameters=model={path / 'parameters.irpa'}", "--function=forward", f"--input=@{tmp_path / 'x.npy'}"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = _printed_values(done.stdout)
    assert len(printed) == 1 and printed[0].shape == (3, 8)
    np.testing.assert_allclose(printed[0], _eager(model, x).numpy(), rtol=1e-4, atol=1e-4)


def test_updated_weights_change_results_without_recompiling(exported, tmp_path):
    model, path = exported
    copy = Path(shutil.copytree(path, tmp_path / "tagger"))
    vmfb_before = (copy / "cpu.vmfb").read_bytes()
    new_weight = torch.randn(8, 32)
    tori.runtime.update_parameters(copy, {"head.weight": new_weight.numpy()})
    assert (copy / "cpu.vmfb").read_bytes() == vmfb_before
    x = torch.randn(5, 16)
    updated = export_models.Tagger().eval()
    updated.load_state_dict(model.state_dict())
    with torch.no_grad():
        updated.head.weight.copy_(new_weight)
    got = tori.runtime.load(copy)(x.numpy())
    np.testing.assert_allclose(got, _eager(updated, x).numpy(), rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, _eager(model, x).numpy(), atol=1e-3)
    with pytest.raises(ArtifactError, match=r"parameters.entries.head.weight.*float32\[8, 32\]"):
        tori.runtime.update_parameters(copy, {"head.weight": np.zeros((8, 31), np.float32)})


@pytest.mark.parametrize("value, field, message", [
    (np.zeros((4, 16), np.float64), r"inputs\[0\] \(x\)\.dtype", "must be float32, got float64"),
    (np.zeros((4, 16, 1), np.float32), r"inputs\[0\] \(x\)\.shape", "must have rank 2"),
    (np.zeros((4, 15), np.float32), r"inputs\[0\] \(x\)\.shape\[1\]", "dimension 1 must be 16, got 15"),
    (np.zeros((33, 16), np.float32), "symbols.batch", r"must be in \[2, 32\], got 33"),
])
def test_inputs_are_checked_against_the_manifest(exported, value, field, message):
    _, path = exported
    loaded = tori.runtime.load(path)
    with pytest.raises(ArtifactError, match=message) as caught:
        loaded(value)
    assert re.search(field, caught.value.field) and str(path / "manifest.json") in str(caught.value)
    with pytest.raises(ArtifactError, match="takes 1 input"):
        loaded(value, value)


def _damaged(path: Path, tmp_path: Path, damage) -> Path:
    copy = Path(shutil.copytree(path, tmp_path / "damaged"))
    damage(copy)
    return copy


def _edit_manifest(change, rehash: bool):
    def damage(folder: Path) -> None:
        manifest = json.loads((folder / "manifest.json").read_text())
        change(manifest)
        if rehash:
            manifest["content_hash"] = fmt.content_hash(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return damage


@pytest.mark.parametrize("damage, file, field, message", [
    (lambda f: (f / "cpu.vmfb").write_bytes((f / "cpu.vmfb").read_bytes()[:1000]), "cpu.vmfb",
     "files.cpu.vmfb.bytes", "truncated"),
    (lambda f: (f / "parameters.irpa").write_bytes(b"\0" * (f / "parameters.irpa").stat().st_size),
     "parameters.irpa", "files.parameters.irpa.sha256", "sha256 differs"),
    (lambda f: (f / "vulkan.vmfb").unlink(), "vulkan.vmfb", "files.vulkan.vmfb", "missing"),
    (_edit_manifest(lambda m: m["symbols"]["batch"].update(max=64), rehash=False), "manifest.json",
     "content_hash", "edited after export"),
    (_edit_manifest(lambda m: m.update(format_version=fmt.FORMAT_VERSION + 1), rehash=True), "manifest.json",
     "format_version", "newer than this tori reads"),
    (lambda f: (f / "manifest.json").write_text("{\"format\": "), "manifest.json", None, "not valid JSON"),
    (lambda f: (f / "manifest.json").unlink(), "manifest.json", None, "missing"),
])
def test_damaged_artifacts_name_the_file_and_field(exported, tmp_path, damage, file, field, message):
    _, path = exported
    copy = _damaged(path, tmp_path, damage)
    with pytest.raises(ArtifactError, match=message) as caught:
        tori.runtime.load(copy)
    assert caught.value.field == field
    assert str(copy / file) in str(caught.value)


def test_failed_export_leaves_the_previous_artifact(tmp_path, monkeypatch):
    model, inputs = export_models.tagger()
    target = tmp_path / "out"
    tori.export(model, inputs, output_dir=target, examples=False)
    before = fmt.read_manifest(target)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(fmt, "write_manifest", fail)
    with pytest.raises(OSError, match="disk full"):
        tori.export(model, inputs, output_dir=target, external_weights=True)
    assert fmt.read_manifest(target) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_several_entry_points_in_one_module(tmp_path):
    model, (x,) = export_models.tagger()
    y = torch.randn(4, 8)
    path = tori.export(model, entry_points={"forward": ("forward", (x,)), "score": tori.EntryPoint("score", (x, y))},
                       output_dir=tmp_path / "two")
    manifest = fmt.read_manifest(path)
    assert manifest["parameters"] is None  # weights inside the module
    assert [o["name"] for o in manifest["entry_points"]["score"]["outputs"]] == ["output_0", "output_1"]
    loaded = tori.runtime.load(path)
    assert sorted(loaded.entry_points) == ["forward", "score"]
    np.testing.assert_allclose(loaded.forward(x.numpy()), _eager(model, x).numpy(), rtol=1e-5, atol=1e-5)
    probabilities, scores = loaded["score"](x.numpy(), y.numpy())
    expected = _eager(lambda a, b: model.score(a, b), x, y)
    np.testing.assert_allclose(probabilities, expected[0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scores, expected[1].numpy(), rtol=1e-5, atol=1e-5)


def test_export_errors_are_clear(tmp_path):
    model, inputs = export_models.tagger()
    with pytest.raises(tori.errors.OptionsError, match="unknown target 'tpu'"):
        tori.export(model, inputs, targets="tpu", output_dir=tmp_path / "x")
    training = torch.nn.Sequential(torch.nn.BatchNorm1d(16)).train()
    with pytest.raises(CompileError, match="updates .*running_mean.* in place"):
        tori.export(training, inputs, output_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists() and not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def c_compiler():
    compiler = shutil.which("cc")
    if compiler is None:
        missing("CC")
    return compiler


def test_cli_export_run_and_c_embed(tmp_path, c_compiler):
    from tori.cli import main

    runner = CliRunner()
    out = tmp_path / "cli"
    factory = f"{ROOT / 'tests' / 'export_models.py'}:tagger"
    result = runner.invoke(main, ["export", factory, "--args-spec", "batch:2..16,16", "--target", "cpu",
                                  "-o", str(out), "--c-embed", "--external-weights"])
    assert result.exit_code == 0, result.output
    assert "forward(x: float32['batch', 16]) -> float32['batch', 8]" in result.output
    manifest = fmt.read_manifest(out)
    assert manifest["symbols"] == {"batch": {"min": 2, "max": 16}}
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    model, _ = export_models.tagger()
    expected = _eager(model, torch.from_numpy(x)).numpy()
    result = runner.invoke(main, ["run", str(out), "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y")])
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(np.load(tmp_path / "y" / "output.npy"), expected, rtol=1e-5, atol=1e-5)
    result = runner.invoke(main, ["run", str(out), "--examples"])
    assert result.exit_code == 0 and "max abs difference vs eager" in result.output, result.output
    assert float(result.output.rsplit(":", 1)[1]) < 1e-5
    result = runner.invoke(main, ["run", str(out), "--input", str(tmp_path / "x.npy"), "--device", "cuda"])
    assert result.exit_code == 2 and "has no module for device 'cuda'" in result.output
    # The embedded module compiles as C, and holds the vmfb's bytes.
    embedded = manifest["c_embed"]["cpu"]
    obj = tmp_path / "module.o"
    done = subprocess.run([c_compiler, "-std=c11", "-Wall", "-Werror", "-c", str(out / embedded["source"]),
                           "-o", str(obj)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # Linked into a program, it hands out the vmfb's exact bytes.
    main_c = tmp_path / "main.c"
    main_c.write_text(textwrap.dedent(f"""
        #include <stdio.h>
        #include "{embedded['header'].rsplit('/', 1)[-1]}"
        int main(void) {{
          const iree_file_toc_t* toc = {embedded['identifier']}_create();
          unsigned long sum = 0;
          for (size_t i = 0; i < toc->size; ++i) sum = (sum * 31 + (unsigned char)toc->data[i]) % 1000000007UL;
          printf("%zu %lu\\n", toc->size, sum);
          return 0;
        }}
    """))
    program = tmp_path / "embedded"
    done = subprocess.run([c_compiler, "-std=c11", f"-I{out / 'c'}", str(main_c), str(obj), "-o", str(program)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    size, checksum = subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout.split()
    vmfb = (out / "cpu.vmfb").read_bytes()
    expected_sum = 0
    for byte in vmfb:
        expected_sum = (expected_sum * 31 + byte) % 1000000007
    assert (int(size), int(checksum)) == (len(vmfb), expected_sum)
