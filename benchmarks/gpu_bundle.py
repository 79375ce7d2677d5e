"""Build the self-contained GPU check: a folder that runs on a machine with an NVIDIA
GPU, Python and a CUDA build of torch, but no IREE, no tori and no network.

    python benchmarks/gpu_bundle.py [--out build/gpu-check] [--archs sm_90,sm_80] [--python 3.12]

The folder holds, per model (the benchmark models and two real architectures, timm's
test_efficientnet and a small transformers BERT, random weights), one artifact per CUDA
architecture from `tori.export` (sm_90 through tori's derived Hopper device target, sm_80
PTX); the first also has a `cpu` module, for the dry run here. Each artifact keeps its
example inputs and eager outputs as .npy, and a TorchScript trace of the model
(`eager.pt`) for timing eager PyTorch on the same GPU. Then tori's package (its runtime
needs only numpy and IREE's runtime), the `iree-base-runtime` wheel for the target
Python, `gpu_check.sh` and `gpu_check.py`. `make gpu-check-bundle` runs this and says
the size, which must stay under 64 MiB (what one call to the GPU machine carries).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from models import MODELS  # noqa: E402

LIMIT_BYTES = 64 << 20
RUNTIME_VERSION = "3.13.0"
SCRIPTS = ("gpu_check.sh", "gpu_check.py")


def _efficientnet():
    from tori.testing import allow_torchvision_import

    allow_torchvision_import()
    import timm

    model = timm.create_model("test_efficientnet", pretrained=False)
    return model, (torch.randn(2, 3, 160, 160, generator=torch.Generator().manual_seed(0)),)


def _bert():
    from tori.testing import allow_torchvision_import

    allow_torchvision_import()  # transformers imports torchvision where it is installed
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=1024, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=512, max_position_embeddings=128)
    model = BertModel(config, add_pooling_layer=False)
    model.config.return_dict = False
    tokens = torch.randint(0, 1024, (2, 64), generator=torch.Generator().manual_seed(0))
    return model, (tokens,)


def _benchmark(name: str):
    def build():
        spec = MODELS[name]
        return spec.build(), tuple(spec.example_inputs())
    return build


BUILDERS = {**{name: _benchmark(name) for name in MODELS}, "timm_test_efficientnet": _efficientnet,
            "transformers_bert_tiny": _bert}


class _FirstOutput(torch.nn.Module):
    """A model whose forward returns a tuple, as one tensor (what the artifact returns)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args):
        out = self.model(*args)
        return out[0] if isinstance(out, (tuple, list)) else out


def build(out: Path, archs: list[str], python: str, wheel: bool = True, names: list[str] | None = None) -> dict:
    import tori

    unknown = sorted(set(names or ()) - set(BUILDERS))
    if unknown:
        raise SystemExit(f"error: no model named {', '.join(unknown)}; the models: {', '.join(BUILDERS)}")
    shutil.rmtree(out, ignore_errors=True)
    (out / "artifacts").mkdir(parents=True)
    models = {}
    for name, make in BUILDERS.items():
        if names and name not in names:
            continue
        torch.manual_seed(0)
        model, inputs = make()
        model = _FirstOutput(model.eval())
        entry = {"artifacts": {}, "eager": None}
        with torch.no_grad():
            for index, arch in enumerate(archs):
                targets = ("cuda", "cpu") if index == 0 else ("cuda",)
                folder = out / "artifacts" / name / arch
                tori.export(model, inputs, targets=targets, output_dir=folder, options={"cuda_arch": arch})
                entry["artifacts"][arch] = str(folder.relative_to(out))
            try:
                traced = torch.jit.trace(model, inputs, check_trace=False)
                traced.save(str(out / "artifacts" / name / "eager.pt"))
                entry["eager"] = f"artifacts/{name}/eager.pt"
            except Exception as error:  # noqa: BLE001 - recorded: that model is then timed without eager
                entry["eager_error"] = f"{type(error).__name__}: {error}"[:300]
        models[name] = entry
        print(f"  {name}: {', '.join(archs)}", flush=True)
    shutil.copytree(ROOT / "python" / "tori", out / "python" / "tori", ignore=shutil.ignore_patterns("__pycache__"))
    for script in SCRIPTS:
        shutil.copy2(ROOT / "benchmarks" / script, out / script)
    wheels = []
    if wheel:
        wheels = _download_wheel(out / "wheels", python)
    manifest = {"archs": archs, "python": python, "iree_runtime": RUNTIME_VERSION, "models": models,
                "wheels": wheels, "torch_built_with": torch.__version__}
    (out / "bundle.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    manifest["bytes"] = size
    return manifest


def _download_wheel(folder: Path, python: str) -> list[str]:
    """IREE's runtime wheel for CPython `python` on x86-64 Linux (pip download, no deps)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           "--python-version", python, "--platform", "manylinux_2_28_x86_64", "--dest", str(folder),
                           f"iree-base-runtime=={RUNTIME_VERSION}"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"error: could not download iree-base-runtime {RUNTIME_VERSION} for Python {python}: "
                         f"{done.stderr.strip()[-500:]}")
    return sorted(p.name for p in folder.glob("*.whl"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "gpu-check")
    parser.add_argument("--archs", default="sm_90,sm_80", help="CUDA architectures, comma-separated")
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python (for the runtime wheel)")
    parser.add_argument("--no-wheel", action="store_true", help="leave the runtime wheel out (a dry run here only)")
    parser.add_argument("--models", help="only these models, comma-separated (default: all)")
    arguments = parser.parse_args(argv)
    manifest = build(arguments.out, arguments.archs.split(","), arguments.python, wheel=not arguments.no_wheel,
                     names=arguments.models.split(",") if arguments.models else None)
    size = manifest["bytes"]
    print(f"{arguments.out}: {len(manifest['models'])} models, {size / (1 << 20):.1f} MiB "
          f"(limit {LIMIT_BYTES >> 20} MiB)")
    if size > LIMIT_BYTES:
        print(f"error: the bundle is {size / (1 << 20):.1f} MiB, over the {LIMIT_BYTES >> 20} MiB a call carries",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
