"""Eager vs inductor vs tori on the benchmark models, and the performance targets.

For each model: compile with each backend (the first call's time is the compile
time), check the output against eager, check that tori really ran compiled,
then time the configurations interleaved in rounds and report medians and ratios.
Then each model's first calls in fresh processes, cold and warm, for tori and
inductor (benchmarks/warm_start.py), and every target with its measured figure.

    python benchmarks/run.py [--models mlp,cnn_bn] [--seconds 1.0] [--json PATH] [--no-first-calls]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tori  # noqa: E402

from tori.runtime.compiled_graph import SETTLED_AFTER_CALLS  # noqa: E402
from tori.stages import Stage  # noqa: E402
from tori.targets.dispatches import graph_dispatch_count  # noqa: E402
from models import MODELS  # noqa: E402
import warm_start  # noqa: E402

# Output tolerance against eager: compiled kernels reorder float reductions.
RTOL = 1e-4
ATOL = 1e-4
# Timed rounds per configuration; interleaving rounds spreads machine noise
# (frequency changes, other processes) evenly over the configurations.
ROUNDS = 10
# Calls before timing: enough for tori's driver trials (both drivers) and caches.
WARMUP_CALLS = SETTLED_AFTER_CALLS + 4


@dataclass
class Measurement:
    median_ms: float | None = None
    min_ms: float | None = None  # the least disturbed call, for comparison with the median
    calls: int = 0
    compile_s: float | None = None
    error: str | None = None
    driver: str | None = None  # tori only
    fallback: str | None = None  # tori only: what ran in eager PyTorch instead
    dispatches: int | None = None  # tori only: IREE dispatches over the model's graphs


@dataclass
class ModelResult:
    model: str
    configs: dict[str, Measurement] = field(default_factory=dict)

    def ratio(self, numerator: str, denominator: str) -> float | None:
        top, bottom = self.configs[numerator].median_ms, self.configs[denominator].median_ms
        if top is None or bottom is None:
            return None
        return top / bottom


# Configuration name -> function turning the eager module into the callable to time.
CONFIGS: dict[str, Callable[[torch.nn.Module], Callable]] = {}


def config(name: str):
    def add(make: Callable[[torch.nn.Module], Callable]) -> Callable[[torch.nn.Module], Callable]:
        CONFIGS[name] = make
        return make

    return add


@config("eager")
def eager(model: torch.nn.Module) -> Callable:
    return model


@config("dynamo")
def dynamo_only(model: torch.nn.Module) -> Callable:
    # Dynamo with its eager backend: the graph runs op by op in PyTorch. Its per-call
    # time over eager's is what Dynamo itself costs any backend (guards, frame handling).
    return torch.compile(model, backend="eager")


@config("inductor")
def inductor(model: torch.nn.Module) -> Callable:
    return torch.compile(model)


@config("tori")
def tori_backend(model: torch.nn.Module) -> Callable:
    # Default options: a graph tori cannot compile falls back to eager, which the
    # counters reveal and the table reports, instead of ending the run.
    return torch.compile(model, backend="tori")


@config("tori-no-passes")
def tori_without_passes(model: torch.nn.Module) -> Callable:
    # The same compile with an empty tori pass pipeline: what tori's passes add.
    return torch.compile(model, backend="tori", options={"pipeline": ""})


@config("tori-codegen-none")
def tori_default_codegen(model: torch.nn.Module) -> Callable:
    # IREE's default code generation for every op family: what targets/codegen.py adds.
    return torch.compile(model, backend="tori", options={"codegen": "none"})


TORI_CONFIGS = ("tori", "tori-no-passes", "tori-codegen-none")


def _first_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0][:240]


def _new_records(seen: set[str]) -> list[tori.CompileRecord]:
    return [r for r in tori.compile_records() if r.name not in seen]


def _compile_errors(records: list[tori.CompileRecord]) -> list[BaseException]:
    errors = [r.error for r in records if r.error]
    return errors + [g.error for r in records for g in r.graphs if g.error]


def _tori_outcome(before: tori.stats.Counters, records: list[tori.CompileRecord], result: Measurement) -> None:
    """Fill the driver and any fallback from tori's counters and compile records."""
    delta = tori.counters.since(before)
    drivers = {g.compiled.driver for r in records for g in r.graphs if g.compiled is not None and g.compiled.driver}
    result.driver = ",".join(sorted(drivers)) or None
    compiled = [(r.options, g) for r in records for g in r.graphs if g.compiled is not None]
    if compiled and all(Stage.TORI in g.stages for _, g in compiled):
        result.dispatches = sum(graph_dispatch_count(g, options) for options, g in compiled)
    if delta.fallback_graphs or delta.fallback_calls or not delta.compiled_calls:
        errors = _compile_errors(records)
        reason = _first_line(errors[0]) if errors else "no call ran compiled"
        result.fallback = f"{delta.fallback_graphs} graph(s) and {delta.fallback_calls} call(s) ran in eager: {reason}"


def prepare(name: str, model: torch.nn.Module, inputs: tuple, expected: torch.Tensor) -> tuple[Callable | None, Measurement]:
    """Build configuration `name`, time its first call, and check it against eager;
    for a tori configuration, also what ran compiled and how many dispatches it has."""
    result = Measurement()
    if name in TORI_CONFIGS:
        tori_before, seen = tori.counters.snapshot(), {r.name for r in tori.compile_records()}
    try:
        fn = CONFIGS[name](model)
        start = time.perf_counter()
        actual = fn(*inputs)
        if name != "eager":
            result.compile_s = time.perf_counter() - start
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
        for _ in range(WARMUP_CALLS):
            fn(*inputs)
    except Exception as error:
        result.error = _first_line(error)
        traceback.print_exc(limit=-3)
        return None, result
    finally:
        if name in TORI_CONFIGS:
            _tori_outcome(tori_before, _new_records(seen), result)
    return fn, result


def time_interleaved(fns: dict[str, Callable], inputs: tuple, seconds: float) -> dict[str, list[float]]:
    """Per-call seconds of each function, timed in ROUNDS rounds that alternate between them.

    A round lasts a fixed time rather than a fixed number of calls, so that one slow
    call cannot shrink the sample."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    clock = time.perf_counter
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            samples = times[name]
            end = clock() + seconds / ROUNDS
            while (start := clock()) < end:
                fn(*inputs)
                samples.append(clock() - start)
    return times


def bench_model(model_name: str, seconds: float) -> ModelResult:
    spec = MODELS[model_name]
    model, inputs = spec.build(), spec.example_inputs()
    result = ModelResult(model_name)
    torch._dynamo.reset()
    with torch.no_grad():
        expected = model(*inputs)
        ready = {}
        for name in CONFIGS:
            fn, result.configs[name] = prepare(name, model, inputs, expected)
            if fn is not None:
                ready[name] = fn
        for name, samples in time_interleaved(ready, inputs, seconds).items():
            result.configs[name].median_ms = statistics.median(samples) * 1e3
            result.configs[name].min_ms = min(samples) * 1e3
            result.configs[name].calls = len(samples)
    torch._dynamo.reset()
    return result


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def _tori_ms(m: Measurement) -> str:
    return "error" if m.error else _ms(m.median_ms) + (" (fallback)" if m.fallback else "")


COLUMNS = (
    "model", "eager ms", "dynamo ms", "inductor ms", "tori ms", "tori speedup vs eager",
    "tori speedup vs inductor", "inductor compile s", "tori compile s", "tori driver",
    "tori no-passes ms", "passes speedup", "dispatches (passes / none)",
)


def table_rows(results: list[ModelResult]) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        eager_m, dynamo_m, inductor_m, tori_m, bare_m = (
            r.configs[n] for n in ("eager", "dynamo", "inductor", "tori", "tori-no-passes"))
        rows.append((
            r.model, _ms(eager_m.median_ms), _ms(dynamo_m.median_ms),
            _ms(inductor_m.median_ms) if not inductor_m.error else "error",
            _tori_ms(tori_m), _x(r.ratio("eager", "tori")), _x(r.ratio("inductor", "tori")),
            _s(inductor_m.compile_s), _s(tori_m.compile_s), tori_m.driver or "-",
            _tori_ms(bare_m), _x(r.ratio("tori-no-passes", "tori")),
            f"{_n(tori_m.dispatches)} / {_n(bare_m.dispatches)}",
        ))
    return rows


def format_table(results: list[ModelResult]) -> str:
    lines = [warm_start.format_rows(COLUMNS, table_rows(results))]
    problems = [
        f"  {r.model} / {name}: {m.error or m.fallback}"
        for r in results for name, m in r.configs.items() if m.error or m.fallback
    ]
    if problems:
        lines += ["", "errors and fallbacks:", *problems]
    return "\n".join(lines)


PACKAGES = ("torch", "torch-mlir", "iree-base-compiler", "iree-base-runtime", "tori")


def environment() -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        },
        "versions": {"python": platform.python_version(), **{p: metadata.version(p) for p in PACKAGES}},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of: " + ", ".join(MODELS))
    parser.add_argument("--seconds", type=float, default=1.0, help="timing per model and configuration (default 1.0)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--no-first-calls", action="store_true",
                        help="skip the cold and warm first calls in fresh processes (and the targets that need them)")
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    return args


@contextlib.contextmanager
def cold_caches() -> Iterator[str]:
    """Point inductor and tori at empty compile caches for the run, so that both
    first-call times are cold compiles."""
    saved = {name: os.environ.get(name) for name in ("TORCHINDUCTOR_CACHE_DIR", "TORI_CACHE_DIR")}
    with tempfile.TemporaryDirectory(prefix="bench-caches-") as empty:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(empty, "inductor")
        os.environ["TORI_CACHE_DIR"] = os.path.join(empty, "tori")
        try:
            with tori.compiler.config.patch(cache_dir=os.path.join(empty, "tori")):
                yield "empty at start"
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


# The performance targets: (name, limit); a measured figure at or below the limit meets it.
TARGETS = {
    "geomean tori/eager": 0.8,
    "slowest tori/eager": 1.0,
    "geomean tori/inductor": 0.9,
    "tiny_linear tori/eager per call": 1.5,
    "worst cold first call tori/inductor": 0.5,
    "worst warm/cold first call, tori": 0.25,
    "iree-compile runs in warm processes": 0,
}


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def measured_targets(results: list[ModelResult], first_calls: list) -> dict[str, dict]:
    """Each target's measured figure (None when this run could not measure it), its
    limit, whether it is met, and the figure per model behind it."""
    over_eager = {r.model: r.ratio("tori", "eager") for r in results if r.ratio("tori", "eager")}
    over_inductor = {r.model: r.ratio("tori", "inductor") for r in results if r.ratio("tori", "inductor")}
    per_model = {
        "geomean tori/eager": over_eager,
        "slowest tori/eager": over_eager,
        "geomean tori/inductor": over_inductor,
        "tiny_linear tori/eager per call": {m: v for m, v in over_eager.items() if m == "tiny_linear"},
        "worst cold first call tori/inductor": {f.model: f.cold_tori_over_inductor for f in first_calls},
        "worst warm/cold first call, tori": {f.model: f.tori_warm_over_cold for f in first_calls},
        "iree-compile runs in warm processes": {f.model: f.warm_compiles for f in first_calls},
    }
    figures = {
        "geomean tori/eager": _geomean(list(over_eager.values())),
        "slowest tori/eager": max(over_eager.values(), default=None),
        "geomean tori/inductor": _geomean(list(over_inductor.values())),
        "tiny_linear tori/eager per call": over_eager.get("tiny_linear"),
        "worst cold first call tori/inductor": max(per_model["worst cold first call tori/inductor"].values(),
                                                   default=None),
        "worst warm/cold first call, tori": max(per_model["worst warm/cold first call, tori"].values(), default=None),
        "iree-compile runs in warm processes": sum(per_model["iree-compile runs in warm processes"].values())
        if first_calls else None,
    }
    return {name: {"measured": figures[name], "limit": limit,
                   "met": None if figures[name] is None else figures[name] <= limit, "per_model": per_model[name]}
            for name, limit in TARGETS.items()}


def format_targets(targets: dict[str, dict]) -> str:
    rows = []
    for name, t in targets.items():
        value = t["measured"]
        shown = "-" if value is None else (str(value) if isinstance(value, int) else f"{value:.2f}")
        rows.append((name, shown, str(t["limit"]), {True: "yes", False: "NO", None: "not measured"}[t["met"]]))
    return warm_start.format_rows(("target", "measured", "limit", "met"), rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = environment()
    with cold_caches() as inductor_cache:
        # Other processes on a 2-core machine distort every figure: the load is reported with them.
        load_before = os.getloadavg()[0]
        results = []
        for name in args.models:
            print(f"benchmarking {name} ...", flush=True)
            results.append(bench_model(name, args.seconds))
        load_after = os.getloadavg()[0]
    print()
    print(format_table(results))
    print(f"\n1-minute load average: {load_before:.2f} before, {load_after:.2f} after ({os.cpu_count()} CPUs)")
    first_calls = []
    if not args.no_first_calls:
        print()
        for name in args.models:
            print(f"first calls of {name} in fresh processes ...", flush=True)
            first_calls.append(warm_start.measure(name))
        print()
        print(warm_start.report(first_calls))
    targets = measured_targets(results, first_calls)
    print()
    print(format_targets(targets))
    if args.json:
        report = {**started, "load_average_1min": {"before": load_before, "after": load_after},
                  "inductor_cache": inductor_cache, "seconds_per_measurement": args.seconds,
                  "columns": COLUMNS, "table": table_rows(results), "results": [asdict(r) for r in results],
                  "first_calls": [f.__dict__ for f in first_calls], "targets": targets}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
