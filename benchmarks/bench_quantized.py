"""Low precision through tori, each ratio from one process (`make bench-quantized`):

- int8 PT2E (torchao's prepare_pt2e / convert_pt2e, X86InductorQuantizer: int8
  per-channel weights, uint8 activations, static and dynamic), on a wide MLP and on
  convolutional networks (dense, grouped and depthwise): latency of the int8 model against
  the float32 one, both through tori, and eager's for both; agreement with eager's
  int8 model and with float32; the exported artifacts' sizes (external weights).
- weight-only int8 decoding (torchao's Int8WeightOnlyConfig): transformers'
  generate() with a static KV cache, ms per token (prefill and transformers' own
  per-token Python included), int8 against float32 through tori, and the decoding
  step alone (the compiled forward of one new token); tokens against eager's
  weight-only model.
- bf16 autocast: the float32 model compiled under `torch.autocast("cpu",
  dtype=torch.bfloat16)`, against eager's autocast: error and latency.

    .venv/bin/python benchmarks/bench_quantized.py --json benchmarks/results/quantized.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_models import REAL_MODELS, llama_config  # noqa: E402

import tori  # noqa: E402
from tori.testing import quantize_pt2e  # noqa: E402


class WideMLP(torch.nn.Module):
    """GEMM-heavy: three linear layers, 1.6M weights."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 10)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


# the real models measured besides the wide MLP, at batch 1: ResNet-18 (dense
# convolutions), and mobile networks' grouped and depthwise convolutions
CONVOLUTION_MODELS = ("resnet18", "mobilenetv3", "efficientnet_b0", "regnety_016")


def _models(names: tuple[str, ...]) -> dict:
    """name -> (float32 model, inputs)."""
    torch.manual_seed(0)
    models = {"wide_mlp b64": (WideMLP().eval(), (torch.randn(64, 512),))} if "wide_mlp" in names else {}
    for name in names:
        if name in REAL_MODELS:
            models[f"{name} b1"] = (REAL_MODELS[name].build(), REAL_MODELS[name].inputs(1))
    return models


def _interleaved(fns: dict, args: tuple, seconds: float, rounds: int = 4) -> dict:
    """Median ms per call of each function, timed in turns."""
    for fn in fns.values():
        fn(*args)
        fn(*args)
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            end = time.perf_counter() + seconds / rounds
            while time.perf_counter() < end:
                start = time.perf_counter()
                fn(*args)
                times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and "examples" not in f.parts)


def measure_pt2e(name: str, model, args: tuple, seconds: float, dynamic: bool = False) -> dict:
    quantized = quantize_pt2e(model, *args, calibration=1, dynamic=dynamic)
    options = {"fallback": "error"}
    with torch.no_grad():
        int8 = torch.compile(quantized, backend="tori", options=options)
        float32 = torch.compile(model, backend="tori", options=options)
        start = time.perf_counter()
        out = int8(*args)
        first_s = time.perf_counter() - start
        eager_int8, eager_float = quantized(*args), model(*args)
        ms = _interleaved({"tori int8": int8, "tori float32": float32, "eager int8": quantized,
                           "eager float32": model}, args, seconds)
    with tempfile.TemporaryDirectory() as folder:
        sizes = {kind: _bytes(tori.export(m, args, output_dir=Path(folder) / kind, external_weights=True,
                                          examples=False))
                 for kind, m in (("int8", quantized), ("float32", model))}
    return {"model": name, "activations": "dynamic" if dynamic else "static", "median_ms": ms,
            "int8_over_float32_tori": ms["tori int8"] / ms["tori float32"],
            "first_call_s": first_s,
            "max_error_vs_eager_int8": (out - eager_int8).abs().max().item(),
            "max_error_eager_int8_vs_float32": (eager_int8 - eager_float).abs().max().item(),
            "top1_agreement_vs_float32": (out.argmax(-1) == eager_float.argmax(-1)).float().mean().item(),
            "artifact_bytes": sizes, "artifact_ratio": sizes["int8"] / sizes["float32"]}


def measure_bf16(name: str, model, args: tuple, seconds: float) -> dict:
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        compiled = torch.compile(copy.deepcopy(model), backend="tori", options={"fallback": "error"})
        out, expected = compiled(*args), model(*args)
        ms = _interleaved({"tori bf16 autocast": compiled, "eager bf16 autocast": model}, args, seconds)
    with torch.no_grad():
        reference = model(*args)
        ms.update(_interleaved({"tori float32": torch.compile(model, backend="tori", options={"fallback": "error"})},
                               args, seconds / 2))
    scale = reference.abs().max().item()
    return {"model": name, "median_ms": ms, "dtype": str(out.dtype),
            "max_error_vs_eager_autocast": (out.float() - expected.float()).abs().max().item() / scale,
            "max_error_eager_autocast_vs_float32": (expected.float() - reference).abs().max().item() / scale}


def measure_weight_only_decode(seconds: float, new_tokens: int = 32) -> dict:
    import transformers
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.set_grad_enabled(False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config()).eval()
    int8 = copy.deepcopy(model)
    quantize_(int8, Int8WeightOnlyConfig())
    prompt = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    settings = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                    cache_implementation="static", pad_token_id=0)
    expected = int8.generate(prompt, **settings)
    # Each configuration alone (Dynamo reset, then compiled again: the compile cache
    # serves it), in turns, so that one model's guards never sit in the other's path.
    models = {"float32": model, "int8": int8}
    eager_forwards = {kind: m.forward for kind, m in models.items()}
    runs: dict[tuple[str, str], list[float]] = {}
    steps: dict[tuple[str, str], list[float]] = {}
    tokens = {}
    for _ in range(3):
        for kind, m in models.items():
            for config in ("eager", "tori"):
                torch._dynamo.reset()
                forward = eager_forwards[kind] if config == "eager" else \
                    torch.compile(eager_forwards[kind], backend="tori", options={"fallback": "error"})
                m.forward = _timing_steps(forward, steps.setdefault((kind, config), []))
                tokens[kind, config] = m.generate(prompt, **settings)
                end = time.perf_counter() + seconds / 3
                while time.perf_counter() < end or len(runs.get((kind, config), ())) < 3:
                    start = time.perf_counter()
                    m.generate(prompt, **settings)
                    runs.setdefault((kind, config), []).append((time.perf_counter() - start) / new_tokens * 1e3)
                m.forward = eager_forwards[kind]
    ms = {f"{kind} {config}": statistics.median(v) for (kind, config), v in runs.items()}
    step_ms = {f"{kind} {config}": statistics.median(v) * 1e3 for (kind, config), v in steps.items()}
    return {"model": "llama_decode", "ms_per_token": ms, "decode_step_ms": step_ms,
            "int8_over_float32_tori": ms["int8 tori"] / ms["float32 tori"],
            "int8_over_float32_tori_step": step_ms["int8 tori"] / step_ms["float32 tori"],
            "tokens_identical_to_eager_int8": torch.equal(tokens["int8", "tori"], expected),
            "weights_mb": {"float32": sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6}}


def _timing_steps(forward, times: list[float]):
    """`forward`, recording the time of each decoding step (one new token) it runs."""
    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = forward(*args, **kwargs)
        if kwargs["input_ids"].shape[-1] == 1:
            times.append(time.perf_counter() - start)
        return out
    return timed


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="timing per configuration")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--no-decode", action="store_true", help="leave weight-only decoding out")
    parser.add_argument("--models", default=",".join(("wide_mlp", *CONVOLUTION_MODELS)),
                        help="comma-separated: wide_mlp and real models' names (benchmarks/real_models.py)")
    args = parser.parse_args()
    names = tuple(n for n in args.models.split(",") if n)
    unknown = [n for n in names if n != "wide_mlp" and n not in REAL_MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}: wide_mlp or one of {sorted(REAL_MODELS)}")
    os.environ.setdefault("TORI_CACHE_DIR", tempfile.mkdtemp(prefix="tori-bench-quantized-"))
    results = {"pt2e": [], "bf16": [], "decode": None}
    for name, (model, inputs) in _models(names).items():
        for dynamic in (False, True):
            row = measure_pt2e(name, model, inputs, args.seconds, dynamic)
            results["pt2e"].append(row)
            print(f"int8 PT2E {row['activations']:<7} {name:<14} tori int8 {row['median_ms']['tori int8']:8.2f} ms, float32 "
                  f"{row['median_ms']['tori float32']:8.2f} ms: {row['int8_over_float32_tori']:.2f}x; eager int8 "
                  f"{row['median_ms']['eager int8']:8.2f}, float32 {row['median_ms']['eager float32']:8.2f}; artifact "
                  f"{row['artifact_ratio']:.2f}x; error vs eager int8 {row['max_error_vs_eager_int8']:.2g} "
                  f"(int8 vs float32 {row['max_error_eager_int8_vs_float32']:.2g})", flush=True)
        row = measure_bf16(name, model, inputs, args.seconds)
        results["bf16"].append(row)
        print(f"bf16 autocast {name:<14} tori {row['median_ms']['tori bf16 autocast']:8.2f} ms, eager "
              f"{row['median_ms']['eager bf16 autocast']:8.2f} ms, tori float32 {row['median_ms']['tori float32']:8.2f}; "
              f"relative error vs eager autocast {row['max_error_vs_eager_autocast']:.2g} (autocast vs float32 "
              f"{row['max_error_eager_autocast_vs_float32']:.2g})", flush=True)
    if not args.no_decode:
        row = measure_weight_only_decode(args.seconds)
        results["decode"] = row
        ms = row["ms_per_token"]
        step = row["decode_step_ms"]
        print(f"weight-only int8 decoding: tori int8 {ms['int8 tori']:.2f} ms/token, float32 {ms['float32 tori']:.2f}: "
              f"{row['int8_over_float32_tori']:.2f}x; eager int8 {ms['int8 eager']:.2f}, float32 "
              f"{ms['float32 eager']:.2f}; the decoding step alone: tori int8 {step['int8 tori']:.2f} ms, float32 "
              f"{step['float32 tori']:.2f}: {row['int8_over_float32_tori_step']:.2f}x; tokens identical: "
              f"{row['tokens_identical_to_eager_int8']}", flush=True)
    results["machine"] = {"cpu": _cpu_name(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
