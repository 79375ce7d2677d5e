"""Eager vs inductor vs tori on real architectures (benchmarks/real_models.py),
one fresh process per model and batch size, with empty compile caches: the first
call's time is a cold compile, then the three are timed in interleaved rounds.

    python benchmarks/bench_models.py [--models resnet18,bert] [--batches 1,8] [--json PATH]
                                      [--tori-options JSON] [--no-inductor] [--seconds S]

Prints per model the medians, the ratios eager/tori and inductor/tori (above 1:
tori is faster), the geomean and the worst case, and static-cache decoding
(ms per token) for a Llama configuration.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RTOL = 2e-3  # random-weight logits of deep networks; compiled kernels reorder float sums
ATOL = 2e-3
ROUNDS = 8
WARMUP_CALLS = 40  # tori's driver trials and the review after 100 calls: see WARMUP_SECONDS
WARMUP_SECONDS = 2.0


def _time_calls(fn, args, seconds: float) -> list[float]:
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return times


def measure_one(name: str, batch: int, seconds: float, tori_options: dict, inductor: bool) -> dict:
    """In this process: compile and time one model at one batch size."""
    import torch

    import tori
    from real_models import REAL_MODELS

    torch.set_grad_enabled(False)
    model = REAL_MODELS[name].build()
    args = REAL_MODELS[name].inputs(batch)
    expected = model(*args)
    first_call_s = {}
    before = tori.counters.snapshot()
    # tori's first call comes first: it pays Dynamo's own first use in the process
    # (imports, tracing caches), which a compile before it would have paid for it.
    configs = {"eager": model, "tori": torch.compile(model, backend="tori", options={"fallback": "error",
                                                                                      **tori_options})}
    if inductor:
        configs["inductor"] = torch.compile(model)
    for config, fn in configs.items():
        if config == "eager":
            continue
        start = time.perf_counter()
        actual = fn(*args)
        first_call_s[config] = time.perf_counter() - start
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m: f"{config} differs: {m}")
    delta = tori.counters.since(before)
    strategies = sorted({str(g.codegen) for r in tori.compile_records() for g in r.graphs if g.codegen is not None})
    for fn in configs.values():  # warm-up, tori's driver choice included
        for _ in range(WARMUP_CALLS):
            fn(*args)
        _time_calls(fn, args, WARMUP_SECONDS / len(configs))
    times: dict[str, list[float]] = {c: [] for c in configs}
    for _ in range(ROUNDS):
        for config, fn in configs.items():
            times[config] += _time_calls(fn, args, seconds / ROUNDS)
    after = tori.counters.since(before)
    if after.fallback_calls or after.fallback_graphs or not after.compiled_graphs:
        raise RuntimeError(f"tori did not run every call compiled: {after}")
    medians = {c: statistics.median(t) * 1e3 for c, t in times.items()}
    return {"model": name, "batch": batch, "median_ms": medians, "first_call_s": first_call_s,
            "graphs": delta.compiled_graphs, "codegen": strategies,
            "tori_driver_choices": _driver_reasons(_driver_choices()),
            "speedup_vs_eager": medians["eager"] / medians["tori"],
            "speedup_vs_inductor": medians["inductor"] / medians["tori"] if inductor else None}


# Static-cache decoding rows: the cache generate() sizes to the prompt and new tokens
# (48 positions), and a 2048-position cache, as a chat application holds one: each step
# attends over every cached position and writes one row of every layer's cache.
DECODE_ROWS = {"llama_decode": None, "llama_decode_2k": 2048}
DECODE_WARMUP_RUNS = 2


def measure_decode(seconds: float, tori_options: dict, inductor: bool, new_tokens: int = 32,
                   cache_length: int | None = None, name: str = "llama_decode") -> dict:
    """transformers' generate() with a static KV cache and the forward compiled: ms per
    token; `cache_length` positions in the cache (None: as many as generate() needs)."""
    import torch
    import transformers

    import tori
    from real_models import llama_config

    torch.set_grad_enabled(False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config()).eval()
    prompt = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    settings = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    if cache_length is None:
        settings["cache_implementation"] = "static"

    def generate():
        if cache_length is None:
            return model.generate(prompt, **settings)
        cache = transformers.StaticCache(config=model.config, max_cache_len=cache_length)
        return model.generate(prompt, past_key_values=cache, **settings)

    eager_forward = model.forward
    backends = {"eager": None, **({"inductor": {}} if inductor else {}),
                "tori": {"backend": "tori", "options": {"fallback": "error", **tori_options}}}
    tokens, first_s = {}, {}
    in_forward = [0.0]

    def timed(forward):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                in_forward[0] += time.perf_counter() - start
        return call

    # Each configuration's forward is compiled (its first generate() timed in full), then
    # the configurations take turns in rounds, as the inference rows do: the machine's
    # drift over a run falls on all of them alike.
    torch._dynamo.reset()
    forwards = {config: timed(eager_forward if compile_args is None else torch.compile(eager_forward, **compile_args))
                for config, compile_args in backends.items()}
    for config, forward in forwards.items():
        model.forward = forward
        start = time.perf_counter()
        tokens[config] = generate()
        first_s[config] = time.perf_counter() - start
    for config, forward in forwards.items():  # warm-up: recompiles, tori's driver choice
        model.forward = forward
        for _ in range(DECODE_WARMUP_RUNS):
            generate()
    runs: dict[str, list[float]] = {c: [] for c in forwards}
    in_forwards: dict[str, list[float]] = {c: [] for c in forwards}
    for _ in range(ROUNDS):
        for config, forward in forwards.items():
            model.forward = forward
            end = time.perf_counter() + seconds / ROUNDS
            while time.perf_counter() < end or not runs[config]:
                in_forward[0] = 0.0
                before = tori.counters.snapshot()
                start = time.perf_counter()
                generate()
                served = tori.counters.since(before)
                if config == "tori" and (served.fallback_calls or served.compiled_calls < new_tokens):
                    raise RuntimeError(f"tori did not run every forward of generate() compiled: {served}")
                runs[config].append((time.perf_counter() - start) / new_tokens * 1e3)
                in_forwards[config].append(in_forward[0] / new_tokens * 1e3)
    per_token = {c: statistics.median(t) for c, t in runs.items()}
    forward_ms = {c: statistics.median(t) for c, t in in_forwards.items()}
    model.forward = eager_forward
    identical = all(torch.equal(tokens["eager"], t) for t in tokens.values())
    if not identical:
        raise RuntimeError("decoded tokens differ from eager's")
    # Decoding reads every weight once per token, but of an embedding table only the
    # token's row: its limit is the machine's memory rate.
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    read = sum(p.numel() * p.element_size() if id(p) not in embeddings else p[0].numel() * p.element_size()
               for p in model.parameters())
    from tori.tools.profile import memory_read_gbps

    choices = _driver_choices()
    drivers = sorted({c.driver for c in choices.values()})
    memory = memory_read_gbps()
    return {"model": name, "batch": 1, "cache_length": cache_length or prompt.shape[1] + new_tokens,
            "median_ms": per_token, "first_call_s": first_s,
            # Per token, the compiled forward's share (Dynamo's guards and wrappers included);
            # the rest is generate()'s own eager work (sampling, stopping criteria, cache positions).
            "forward_ms": forward_ms, "tori_drivers": drivers,
            "tori_driver_choices": _driver_reasons(choices),
            "tokens_identical": identical, "weights_read_mb": read / 1e6,
            "gb_per_s_tori": read / (forward_ms["tori"] * 1e-3) / 1e9, "memory_read_gb_per_s": memory,
            "memory_fraction_tori": read / (forward_ms["tori"] * 1e-3) / 1e9 / memory,
            "speedup_vs_eager": per_token["eager"] / per_token["tori"],
            "speedup_vs_inductor": per_token["inductor"] / per_token["tori"] if inductor else None}


def _child(name: str, batch: int, args: argparse.Namespace) -> dict:
    """One model in a fresh process with empty tori and inductor caches."""
    with tempfile.TemporaryDirectory(prefix="tori-bench-models-") as caches:
        env = {**os.environ, "TORI_CACHE_DIR": f"{caches}/tori", "TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor"}
        command = [sys.executable, __file__, "--one", name, "--batches", str(batch), "--seconds", str(args.seconds),
                   "--tori-options", args.tori_options] + (["--no-inductor"] if args.no_inductor else [])
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "batch": batch, "error": tail[:300]}
    return json.loads(lines[-1])


def _driver_choices() -> dict:
    """Each compiled graph's driver choice in this process, by graph name."""
    import tori
    from tori.runtime.compiled_graph import CompiledGraph

    return {g.name: g.compiled.driver_choice for r in tori.compile_records() for g in r.graphs
            if isinstance(g.compiled, CompiledGraph) and g.compiled.driver_choice}


def _driver_reasons(choices: dict) -> dict:
    """The JSON form of `_driver_choices()`: "driver: why" by graph name."""
    return {name: f"{c.driver}: {c.reason}" for name, c in choices.items()}


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(results: list[dict]) -> dict:
    inference = [r for r in results if "error" not in r and r["model"] not in DECODE_ROWS]
    eager = [r["speedup_vs_eager"] for r in inference]
    inductor = [r["speedup_vs_inductor"] for r in inference if r.get("speedup_vs_inductor")]
    worst = min(inference, key=lambda r: r["speedup_vs_eager"], default=None)
    firsts = [r["first_call_s"]["tori"] for r in inference]
    firsts_inductor = [r["first_call_s"]["inductor"] for r in inference if "inductor" in r["first_call_s"]]
    return {"geomean_speedup_vs_eager": geomean(eager), "geomean_speedup_vs_inductor": geomean(inductor),
            "worst": f"{worst['model']} b{worst['batch']} {worst['speedup_vs_eager']:.2f}" if worst else None,
            "geomean_first_call_s": geomean(firsts), "geomean_first_call_s_inductor": geomean(firsts_inductor),
            "failed": [f"{r['model']} b{r['batch']}: {r['error']}" for r in results if "error" in r]}


def _row(r: dict) -> str:
    if "error" in r:
        return f"{r['model']:<16} b{r['batch']:<3} error: {r['error']}"
    ms = r["median_ms"]
    inductor = f"{ms['inductor']:9.2f}" if "inductor" in ms else f"{'-':>9}"
    vs_inductor = f"{r['speedup_vs_inductor']:6.2f}" if r.get("speedup_vs_inductor") else f"{'-':>6}"
    first = r["first_call_s"]
    return (f"{r['model']:<16} b{r['batch']:<3} {ms['eager']:9.2f} {inductor} {ms['tori']:9.2f} "
            f"{r['speedup_vs_eager']:6.2f} {vs_inductor} {first['tori']:7.1f} {first.get('inductor', float('nan')):7.1f}")


def _decode_split(r: dict) -> str:
    forward = ", ".join(f"{c} {ms:.2f}" for c, ms in r["forward_ms"].items())
    return (f"{'':<21} in the forward, ms per token: {forward}; tori reads {r['weights_read_mb']:.0f} MB per "
            f"token at {r['gb_per_s_tori']:.1f} GB/s ({r['memory_fraction_tori']:.0%} of "
            f"{r['memory_read_gb_per_s']:.1f}) on {', '.join(r['tori_drivers'])}")


def main() -> int:
    from real_models import REAL_MODELS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join([*REAL_MODELS, *DECODE_ROWS]))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per configuration")
    parser.add_argument("--tori-options", default="{}", help="tori options as JSON, e.g. '{\"codegen\": \"none\"}'")
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per model process")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tori_options = json.loads(args.tori_options)
    batches = [int(b) for b in args.batches.split(",")]
    if args.one:
        if args.one in DECODE_ROWS:
            print(json.dumps(measure_decode(args.seconds, tori_options, not args.no_inductor,
                                            cache_length=DECODE_ROWS[args.one], name=args.one)))
        else:
            print(json.dumps(measure_one(args.one, batches[0], args.seconds, tori_options, not args.no_inductor)))
        return 0
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"{'model':<16} {'batch':<4} {'eager ms':>9} {'induct ms':>9} {'tori ms':>9} {'x eag':>6} {'x ind':>6} "
          f"{'1st s':>7} {'ind 1st':>7}", flush=True)
    results = []
    for name in args.models.split(","):
        for batch in ([1] if name in DECODE_ROWS else batches):
            results.append(_child(name, batch, args))
            print(_row(results[-1]), flush=True)
            if "forward_ms" in results[-1]:
                print(_decode_split(results[-1]), flush=True)
    summary = summarize(results)
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "started": started.isoformat(timespec="seconds"), "command": " ".join(sys.argv),
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
            "tori_options": tori_options, "results": results, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
