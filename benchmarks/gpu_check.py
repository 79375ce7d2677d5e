"""Run every artifact of a GPU check bundle (benchmarks/gpu_bundle.py) on one device and
write one JSON: each artifact's results against its expected outputs, through numpy
(`tori.runtime.load`) and through DLPack (torch tensors in the device's memory), timed
against eager PyTorch (the bundle's TorchScript trace) on the same device.

    python gpu_check.py BUNDLE --device cuda|cpu --json OUT.json [--calls N]

Needs only numpy, IREE's runtime and tori's package (the bundle's); torch for DLPack
and eager timing (where torch is missing, those are recorded as skipped). `--device cpu`
is the dry run: the same models, their `cpu` modules.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

TOLERANCE = 2e-3  # relative to the largest expected magnitude: GPU kernels reassociate sums


def _error(actual: np.ndarray, expected: np.ndarray) -> float:
    scale = max(1.0, float(np.abs(expected).max()) if expected.size else 1.0)
    return float(np.abs(actual.astype(np.float64) - expected.astype(np.float64)).max()) / scale if expected.size else 0.0


def _median_ms(call, calls: int, sync=lambda: None) -> float:
    call()
    sync()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def check_artifact(folder: Path, device: str, calls: int, eager_path: Path | None) -> dict:
    import tori.runtime

    artifact = tori.runtime.load(folder, device=device)
    entry = artifact.entry_points["forward"]
    examples = artifact.manifest["entry_points"]["forward"]["examples"]
    inputs = [np.load(folder / path) for path in examples["inputs"]]
    expected = [np.load(folder / path) for path in examples["outputs"]]
    result: dict = {"artifact": str(folder), "device": device, "driver": artifact.driver}
    out = entry(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    result["numpy"] = {"max_error": max(_error(a, e) for a, e in zip(outs, expected)),
                       "ms": _median_ms(lambda: entry(*inputs), calls)}
    try:
        import torch
    except ImportError:
        result["dlpack"] = result["eager"] = {"skipped": "torch is not installed"}
        return result
    where = torch.device("cuda" if device == "cuda" else "cpu")
    sync = torch.cuda.synchronize if where.type == "cuda" else (lambda: None)
    # Memory of torch's own allocator (a copy): IREE imports host memory aligned to 64 bytes.
    tensors = [torch.from_numpy(x).to(where).clone() for x in inputs]
    sync()  # IREE reads them on its own stream: torch's copies must have landed
    got = entry.dlpack(*tensors)
    got = got if isinstance(got, tuple) else (got,)
    dl_outputs = [torch.from_dlpack(g) for g in got]
    result["dlpack"] = {"on": str(dl_outputs[0].device),
                        "max_error": max(_error(t.cpu().numpy(), e) for t, e in zip(dl_outputs, expected)),
                        "ms": _median_ms(lambda: entry.dlpack(*tensors), calls, sync)}
    if eager_path is None or not eager_path.exists():
        result["eager"] = {"skipped": "no TorchScript trace in the bundle"}
        return result
    try:
        model = torch.jit.load(str(eager_path), map_location=where).eval()
        with torch.no_grad():
            eager_out = model(*tensors)
            eager_ms = _median_ms(lambda: model(*tensors), calls, sync)
        first = eager_out[0] if isinstance(eager_out, (tuple, list)) else eager_out
        result["eager"] = {"ms": eager_ms, "max_error": _error(first.cpu().numpy(), expected[0])}
        result["eager_over_tori"] = eager_ms / result["dlpack"]["ms"]
    except Exception as error:  # noqa: BLE001 - recorded: the trace may not load in another torch
        result["eager"] = {"error": f"{type(error).__name__}: {error}"[:300]}
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=20)
    arguments = parser.parse_args(argv)
    manifest = json.loads((arguments.bundle / "bundle.json").read_text())
    rows, failures = [], []
    for name, model in manifest["models"].items():
        eager = arguments.bundle / model["eager"] if model.get("eager") else None
        for arch, folder in model["artifacts"].items():
            folder = arguments.bundle / folder
            has_target = arguments.device in json.loads((folder / "manifest.json").read_text())["targets"]
            if not has_target:
                continue
            try:
                row = check_artifact(folder, arguments.device, arguments.calls, eager)
            except Exception as error:  # noqa: BLE001 - every artifact is tried and reported
                row = {"artifact": str(folder), "error": f"{type(error).__name__}: {error}"[:500]}
            row.update(model=name, arch=arch)
            ok = "error" not in row and row["numpy"]["max_error"] <= TOLERANCE and (
                "max_error" not in row.get("dlpack", {}) or row["dlpack"]["max_error"] <= TOLERANCE)
            row["ok"] = ok
            if not ok:
                failures.append(f"{name} {arch}")
            rows.append(row)
            print(f"{name:24s} {arch:6s} {'ok' if ok else 'FAILED':6s} "
                  f"numpy {row.get('numpy', {}).get('ms', float('nan')):8.3f} ms  "
                  f"dlpack {row.get('dlpack', {}).get('ms', float('nan')):8.3f} ms  "
                  f"eager {row.get('eager', {}).get('ms', float('nan')):8.3f} ms  {row.get('error', '')}", flush=True)
    import iree.runtime
    import tori.runtime

    summary = {"device": arguments.device, "artifacts": len(rows), "failed": failures, "rows": rows,
               "tori_runtime": tori.runtime.__file__, "iree_runtime": iree.runtime.__file__}
    try:
        import torch

        summary["torch"] = torch.__version__
        if arguments.device == "cuda" and torch.cuda.is_available():
            summary["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    arguments.json.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{len(rows)} artifacts on {arguments.device}, {len(failures)} failed; {arguments.json}")
    return 0 if rows and not failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
