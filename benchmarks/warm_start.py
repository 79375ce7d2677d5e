"""Cold and warm first calls: each benchmark model's first compiled call in a fresh
process, first with empty compile caches (cold), then in another fresh process with
the caches the first one filled (warm); for tori and for inductor, with where tori's
time goes.

    python benchmarks/warm_start.py [--models mlp,cnn_bn] [--json PATH]

A warm tori process must run no iree-compile; the script fails if one does.
`benchmarks/run.py` (`make bench`) runs the same measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BACKENDS = ("tori", "inductor")
# Where a tori first call spends its time; "dynamo" is the rest of the call: Dynamo's
# tracing, guards and bytecode, torch's lazy imports, and the call itself.
TORI_STAGES = ("dynamo", "aotautograd", "import+passes", "cache lookup", "iree-compile", "module load")


def child(name: str, backend: str) -> dict:
    """One fresh process: build the model, compile on the first call; seconds by stage."""
    import torch

    sys.path.insert(0, str(HERE))
    from models import MODELS

    model = MODELS[name]
    module, inputs = model.build(), model.example_inputs()
    if backend == "inductor":
        compiled = torch.compile(module)
        begin = time.perf_counter()
        with torch.no_grad():
            compiled(*inputs)
        first_call = time.perf_counter() - begin
        from torch._dynamo.utils import counters as dynamo_counters

        return {"model": name, "backend": backend, "first_call_s": first_call,
                "fx_graph_cache_hits": dynamo_counters["inductor"]["fxgraph_cache_hit"]}

    import tori.frontend.compile_graph as cg
    import tori.targets.build as build
    from tori.frontend.backend import tori_backend
    from tori.stats import counters

    spent = dict.fromkeys(TORI_STAGES, 0.0)

    def timed(stage, fn):
        def run(*args, **kwargs):
            begin = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[stage] += time.perf_counter() - begin
        return run

    cg.import_graph = timed("import+passes", cg.import_graph)
    cg.run_pipeline = timed("import+passes", cg.run_pipeline)
    build.run_iree_compile = timed("iree-compile", build.run_iree_compile)
    cg.runtime_graph = timed("module load", cg.runtime_graph)
    original_cache = cg.compile_cache

    def cache_with_timing(options):
        cache = original_cache(options)
        if cache is not None and not hasattr(cache, "_timed"):
            cache.get = timed("cache lookup", cache.get)
            cache._timed = True
        return cache

    cg.compile_cache = cache_with_timing
    backend_s = [0.0]

    def timed_backend(gm, example_inputs):
        begin = time.perf_counter()
        try:
            return tori_backend(gm, example_inputs, options={"fallback": "error"})
        finally:
            backend_s[0] += time.perf_counter() - begin

    compiled = torch.compile(module, backend=timed_backend)
    begin = time.perf_counter()
    with torch.no_grad():
        compiled(*inputs)
    first_call = time.perf_counter() - begin
    tori_stages = sum(spent.values())
    spent["aotautograd"] = backend_s[0] - tori_stages
    spent["dynamo"] = first_call - backend_s[0]
    return {"model": name, "backend": backend, "first_call_s": first_call, "stages_s": spent,
            "iree_compiles": counters.iree_compiles, "cache_hits": counters.cache_hits,
            "compiled_graphs": counters.compiled_graphs, "fallback_graphs": counters.fallback_graphs}


def run_child(name: str, backend: str, cache_dir: str) -> dict:
    env = {**os.environ, "TORI_CACHE_DIR": os.path.join(cache_dir, "tori"), "TORI_CACHE": "1",
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_dir, "inductor")}
    env.pop("TORI_CACHE_URL", None)
    done = subprocess.run([sys.executable, __file__, "--child", name, "--backend", backend], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{backend} first call of {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class FirstCalls:
    """One model's first calls: cold and warm, tori and inductor, each a fresh process."""

    model: str
    runs: dict[str, dict]  # "tori cold", "tori warm", "inductor cold", "inductor warm"

    def seconds(self, run: str) -> float:
        return self.runs[run]["first_call_s"]

    @property
    def tori_warm_over_cold(self) -> float:
        return self.seconds("tori warm") / self.seconds("tori cold")

    @property
    def inductor_warm_over_cold(self) -> float:
        return self.seconds("inductor warm") / self.seconds("inductor cold")

    @property
    def cold_tori_over_inductor(self) -> float:
        return self.seconds("tori cold") / self.seconds("inductor cold")

    @property
    def warm_compiles(self) -> int:
        return self.runs["tori warm"]["iree_compiles"]


def measure(name: str) -> FirstCalls:
    runs = {}
    for backend in BACKENDS:
        with tempfile.TemporaryDirectory(prefix="tori-first-call-") as cache_dir:
            runs[f"{backend} cold"] = run_child(name, backend, cache_dir)
            runs[f"{backend} warm"] = run_child(name, backend, cache_dir)
    return FirstCalls(name, runs)


HEADER = ("model", "tori cold s", "tori warm s", "tori warm/cold", "inductor cold s", "inductor warm s",
          "inductor warm/cold", "tori cold / inductor cold", "warm iree-compiles")


def row(first: FirstCalls) -> tuple[str, ...]:
    return (first.model, f"{first.seconds('tori cold'):.2f}", f"{first.seconds('tori warm'):.2f}",
            f"{first.tori_warm_over_cold:.2f}", f"{first.seconds('inductor cold'):.2f}",
            f"{first.seconds('inductor warm'):.2f}", f"{first.inductor_warm_over_cold:.2f}",
            f"{first.cold_tori_over_inductor:.2f}", str(first.warm_compiles))


def stage_rows(first: FirstCalls) -> list[tuple[str, ...]]:
    """Where tori's cold and warm first calls spend their time, in seconds."""
    return [(first.model, when, *(f"{first.runs[f'tori {when}']['stages_s'][s]:.2f}" for s in TORI_STAGES))
            for when in ("cold", "warm")]


def format_rows(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def report(results: list[FirstCalls]) -> str:
    return "\n\n".join([
        format_rows(HEADER, [row(r) for r in results]),
        "where tori's first calls spend their time (s):",
        format_rows(("model", "cache", *TORI_STAGES), [s for r in results for s in stage_rows(r)]),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="")
    parser.add_argument("--json")
    parser.add_argument("--child")
    parser.add_argument("--backend", choices=BACKENDS, default="tori")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.backend)))
        return
    sys.path.insert(0, str(HERE))
    from models import MODELS

    names = args.models.split(",") if args.models else list(MODELS)
    results = []
    for name in names:
        print(f"first calls of {name} ...", flush=True)
        results.append(measure(name))
    print(report(results))
    compiled = [r.model for r in results if r.warm_compiles]
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=2) + "\n")
    if compiled:
        raise SystemExit(f"warm processes ran iree-compile: {', '.join(compiled)}")


if __name__ == "__main__":
    main()
