"""Export every benchmark model for CPU and Vulkan and check each artifact three ways:
tori.runtime.load in an interpreter where PyTorch cannot be imported, iree-run-module
on the command line, both against the eager outputs saved at export.

    python benchmarks/export_check.py [--out DIR] [--targets cpu,vulkan] [--models mlp,cnn_bn]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent

# Run in a fresh interpreter where importing torch (or a compiler) fails.
TORCH_FREE = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torch_mlir") or name.startswith("iree.compiler"):
            raise ImportError(name + " is not installed here")
sys.meta_path.insert(0, Refuse())
from tori.cli import main
main(["run", sys.argv[1], "--examples", "--device", sys.argv[2]])
"""


def iree_run_module(path: Path, device: str) -> float:
    """Max abs difference between iree-run-module's output and eager's."""
    import json

    manifest = json.loads((path / "manifest.json").read_text())
    entry = manifest["entry_points"]["forward"]
    command = [str(BIN / "iree-run-module"), f"--module={path / manifest['targets'][device]['file']}",
               f"--device={manifest['targets'][device]['drivers'][0]}", "--function=forward",
               *[f"--input=@{path / f}" for f in entry["examples"]["inputs"]]]
    if manifest["parameters"]:
        command.append(f"--parameters=model={path / manifest['parameters']['file']}")
    with tempfile.TemporaryDirectory() as folder:
        # Large results are elided when printed: written as .npy instead.
        result = Path(folder) / "result.npy"
        done = subprocess.run([*command, f"--output=@{result}"], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip())
        got = np.load(result)
    expected = np.load(path / entry["examples"]["outputs"][0])
    return float(np.abs(got - expected).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/tori-export-check"))
    parser.add_argument("--targets", default="cpu,vulkan")
    parser.add_argument("--models", default="")
    parser.add_argument("--external-weights", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import tori
    from models import MODELS

    targets = args.targets.split(",")
    for name, bench in MODELS.items():
        if args.models and name not in args.models.split(","):
            continue
        start = time.perf_counter()
        try:
            path = tori.export(bench.build(), bench.example_inputs(), targets=targets, output_dir=args.out / name,
                               external_weights=args.external_weights)
        except tori.errors.ToriError as error:
            print(f"{name}: export failed: {str(error).splitlines()[0]}", flush=True)
            continue
        line = [f"{name}: exported in {time.perf_counter() - start:.1f} s"]
        for target in targets:
            done = subprocess.run([sys.executable, "-c", TORCH_FREE, str(path), target], capture_output=True,
                                  text=True, timeout=600)
            found = re.search(r"max abs difference vs eager \(saved at export\): (\S+)", done.stdout)
            torch_free = found.group(1) if done.returncode == 0 and found else f"FAILED {done.stderr.strip()[-200:]}"
            try:
                cli = f"{iree_run_module(path, target):.1e}"
            except Exception as error:  # reported, not raised: one line per model
                cli = f"FAILED {str(error)[:200]}"
            line.append(f"{target}: torch-free {torch_free}, iree-run-module {cli}")
        print("; ".join(line), flush=True)


if __name__ == "__main__":
    main()
