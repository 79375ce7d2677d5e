#!/usr/bin/env bash
# The GPU check, run from inside a bundle that benchmarks/gpu_bundle.py built
# (`make gpu-check-bundle`): installs IREE's runtime wheel into a temporary folder,
# runs every artifact with tori's runtime on the GPU (numpy in and out, and CUDA
# tensors by DLPack), compares with the expected outputs, times each against eager
# PyTorch on the same GPU and writes one JSON. Under 5 minutes on one GPU.
#
#   ./gpu_check.sh [OUT.json]             on a machine with an NVIDIA GPU
#   ./gpu_check.sh --dry-run [OUT.json]   here: the same models' cpu modules, and the
#                                         carried wheel's install checked for its Python
set -euo pipefail
cd "$(dirname "$0")"
DEVICE=cuda
if [ "${1:-}" = "--dry-run" ]; then DEVICE=cpu; shift; fi
OUT=${1:-gpu-check.json}
PY=${PY:-python3}
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
TAG=$($PY -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
WHEEL=$(ls wheels/iree_base_runtime-*-"$TAG"-*.whl 2>/dev/null | head -1 || true)
if [ -n "$WHEEL" ]; then
    $PY -m pip install --quiet --no-deps --no-index --target "$SCRATCH/site" "$WHEEL"
    export PYTHONPATH="$SCRATCH/site:$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
elif [ "$DEVICE" = cpu ]; then
    # The dry run on another Python than the GPU machine's: the carried wheel must
    # install for the Python it was downloaded for; the run uses this Python's runtime.
    CARRIED=$(ls wheels/iree_base_runtime-*.whl 2>/dev/null | head -1 || true)
    if [ -n "$CARRIED" ]; then
        FOR=$(basename "$CARRIED" | sed -E 's/.*-cp([0-9])([0-9]+)-.*/\1.\2/')
        $PY -m pip install --quiet --no-deps --no-index --only-binary=:all: --python-version "$FOR" \
            --platform manylinux_2_28_x86_64 --target "$SCRATCH/carried" "$CARRIED"
        test -d "$SCRATCH/carried/iree/_runtime_libs" || { echo "error: $CARRIED installed without IREE's runtime libraries" >&2; exit 1; }
        echo "carried wheel $(basename "$CARRIED") installs for Python $FOR"
    fi
    export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "error: no iree-base-runtime wheel for $TAG in wheels/ (the bundle was built for $(ls wheels 2>/dev/null))" >&2
    exit 1
fi
if [ "$DEVICE" = cuda ]; then
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader || true
fi
$PY -c "import iree.runtime as rt, sys; print('IREE runtime', rt.__file__); sys.exit(0 if '$DEVICE' == 'cpu' or rt.get_driver('cuda').query_available_devices() else 1)"
timeout 270 $PY gpu_check.py . --device "$DEVICE" --json "$OUT"
