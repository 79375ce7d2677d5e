# Set-up and everyday commands. Each target creates .venv if missing and installs
# the pinned dependencies (constraints.txt) and tori in editable mode.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tori-installed
PYTEST_ARGS ?=

.PHONY: all venv demo test test-extended bench bench-models bench-quantized bench-distributed gpu-check-bundle fuzz conformance clean

all: test

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m tori.demo

# The suite in TEST_WORKERS processes (pytest-xdist); tests marked with one `xdist_group`
# run in the same worker, one after another. The 20 slowest are listed at the end: the
# suite is to stay under 25 minutes on 2 cores (23.6 on 2026-12-04 on a quiet host,
# 27.5-30.8 on busier ones). Three workers on two cores were slower.
TEST_WORKERS ?= 2
test: $(STAMP)
	bash tests/setup/system-packages.sh
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=20 $(PYTEST_ARGS)

# The long checks left out of `make test` and CI (marked `extended`).
test-extended: $(STAMP)
	bash tests/setup/system-packages.sh
	$(PY) -m pytest -q -m extended $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/run.py --json benchmarks/results/latest.json

# Real architectures (timm, transformers; random weights), eager vs inductor vs tori, one fresh
# process per model and batch size (BENCH_MODELS_ARGS: --models, --batches, --tori-options).
BENCH_MODELS_ARGS ?=
bench-models: $(STAMP)
	$(PY) benchmarks/bench_models.py --json benchmarks/results/models.json $(BENCH_MODELS_ARGS)

# Low precision (docs/quantization.md): int8 PT2E and bf16 autocast against float32, weight-only int8
# decoding, exported artifact sizes; ratios from one process.
bench-quantized: $(STAMP)
	$(PY) benchmarks/bench_quantized.py --json benchmarks/results/quantized.json

# DDP training step time on 2 gloo ranks: eager vs inductor vs tori in one run (docs/distributed.md).
bench-distributed: $(STAMP)
	$(PY) benchmarks/distributed.py --json benchmarks/results/distributed.json

# The self-contained GPU check (docs/targets.md): artifacts for sm_90 and sm_80, IREE's
# runtime wheel for the GPU machine's Python (GPU_PYTHON), tori's package and the scripts,
# in build/gpu-check (under 64 MiB); `build/gpu-check/gpu_check.sh --dry-run` runs it here.
GPU_PYTHON ?= 3.12
gpu-check-bundle: $(STAMP)
	$(PY) benchmarks/gpu_bundle.py --out build/gpu-check --python $(GPU_PYTHON)
	du -sh build/gpu-check

# Differential fuzzing against eager, a longer budget than the test suite's (FUZZ_ARGS: --seeds, --batches).
FUZZ_ARGS ?=
fuzz: $(STAMP)
	$(PY) -m tori.fuzz $(FUZZ_ARGS)

# PyTorch's OpInfo database through tori, every op in float32 and float16 (CONFORMANCE_ARGS:
# --mode tori-fallback or inductor, --ops, --update-expected); the summary lands in build/conformance/.
CONFORMANCE_ARGS ?=
conformance: $(STAMP)
	mkdir -p build/conformance
	$(PY) -m tori.conformance --summary build/conformance/summary.md --json build/conformance/outcomes.jsonl $(CONFORMANCE_ARGS)

clean:
	rm -rf $(VENV) build python/*.egg-info .pytest_cache
