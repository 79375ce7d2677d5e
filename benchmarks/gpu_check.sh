#!/usr/bin/env bash
# On a machine with a CUDA GPU: the GPU tests, then every benchmark model on CUDA
# against eager with latencies (eager, tori on CUDA). Under 5 minutes on one GPU.
# Usage: benchmarks/gpu_check.sh [cuda_arch]   (default: sm_80 PTX, which any newer GPU runs)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ARCH=${1:-sm_80}
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader || true
$PY -c "import iree.runtime as rt; print('IREE cuda devices:', rt.get_driver('cuda').query_available_devices())"
TORI_CUDA_ARCH=$ARCH timeout 240 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_targets.py -rs
TORI_CUDA_ARCH=$ARCH timeout 120 $PY - <<'PY'
import sys, time, torch
sys.path.insert(0, "benchmarks")
from models import MODELS
def best(fn, x, n=20):
    fn(*x); torch.cuda.synchronize(); times = []
    for _ in range(n):
        t = time.perf_counter(); fn(*x); torch.cuda.synchronize(); times.append(time.perf_counter() - t)
    return min(times) * 1e3
print(f"{'model':18} {'eager ms':>9} {'tori ms':>9} {'ratio':>6} {'max err':>9}")
for name, spec in MODELS.items():
    model = spec.build().cuda(); x = tuple(t.cuda() for t in spec.example_inputs())
    with torch.no_grad():
        compiled = torch.compile(model, backend="tori", options={"target": "cuda", "fallback": "error"})
        err = (compiled(*x) - model(*x)).abs().max().item()
        e, t = best(model, x), best(compiled, x)
    print(f"{name:18} {e:9.3f} {t:9.3f} {e / t:6.2f} {err:9.2e}")
PY
