"""Cold vs warm first call: each benchmark model's first compiled call in a fresh
process, first with an empty compile cache (cold), then in another fresh process
with the cache the first one filled (warm); with where the time goes.

    python benchmarks/warm_start.py [--models mlp,cnn_bn] [--json PATH]

The warm process must run no iree-compile; the script fails if one does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(name: str) -> dict:
    """One fresh process: import, build, compile on the first call; per-stage seconds."""
    start = time.perf_counter()
    import torch

    import tori.frontend.compile_graph as cg
    from tori.stats import counters

    sys.path.insert(0, str(HERE))
    from models import MODELS

    imported = time.perf_counter() - start
    spent = {"import+passes": 0.0, "cache lookup": 0.0, "iree-compile": 0.0, "module load": 0.0}

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
    cg.run_iree_compile = timed("iree-compile", cg.run_iree_compile)
    cg.runtime_graph = timed("module load", cg.runtime_graph)
    original_cache = cg.compile_cache

    def cache_with_timing(options):
        cache = original_cache(options)
        if cache is not None and not hasattr(cache, "_timed"):
            cache.get = timed("cache lookup", cache.get)
            cache._timed = True
        return cache

    cg.compile_cache = cache_with_timing
    model = MODELS[name]
    module, inputs = model.build(), model.example_inputs()
    compiled = torch.compile(module, backend="tori", options={"fallback": "error"})
    begin = time.perf_counter()
    with torch.no_grad():
        compiled(*inputs)
    first_call = time.perf_counter() - begin
    from tori.frontend.records import compile_records

    tori_seconds = sum(g.compile_seconds for r in compile_records() for g in r.graphs)
    return {"model": name, "import_s": imported, "first_call_s": first_call,
            "tori_compile_s": tori_seconds, "dynamo_aot_runtime_s": first_call - tori_seconds,
            "stages_s": spent, "iree_compiles": counters.iree_compiles, "cache_hits": counters.cache_hits,
            "compiled_graphs": counters.compiled_graphs}


def run_child(name: str, cache_dir: str) -> dict:
    env = {**os.environ, "TORI_CACHE_DIR": cache_dir, "TORI_CACHE": "1"}
    env.pop("TORI_CACHE_URL", None)
    done = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="")
    parser.add_argument("--json")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    sys.path.insert(0, str(HERE))
    from models import MODELS

    names = args.models.split(",") if args.models else list(MODELS)
    rows = []
    print(f"{'model':18} {'cold s':>8} {'warm s':>8} {'warm/cold':>9}  warm: iree  dynamo+aot  import+passes  "
          f"lookup  load")
    for name in names:
        with tempfile.TemporaryDirectory(prefix="tori-warm-start-") as cache_dir:
            cold = run_child(name, cache_dir)
            warm = run_child(name, cache_dir)
        if warm["iree_compiles"] != 0 or warm["cache_hits"] < 1:
            raise SystemExit(f"{name}: the warm process compiled {warm['iree_compiles']} module(s)")
        ratio = warm["first_call_s"] / cold["first_call_s"]
        s = warm["stages_s"]
        print(f"{name:18} {cold['first_call_s']:8.2f} {warm['first_call_s']:8.2f} {ratio:9.2f}  "
              f"{s['iree-compile']:10.2f}  {warm['dynamo_aot_runtime_s']:10.2f}  {s['import+passes']:13.2f}  "
              f"{s['cache lookup']:6.3f}  {s['module load']:5.3f}")
        rows.append({"model": name, "cold": cold, "warm": warm, "warm_over_cold": ratio})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
