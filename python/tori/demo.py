"""A tour of tori: compile a small transformer encoder layer and a small CNN,
check them against eager PyTorch, show each pipeline stage, and time both.

    python -m tori.demo
"""

from __future__ import annotations

import collections
import re
import statistics
import time
from typing import Callable

import torch
from torch import nn

import tori
from tori.runtime.compiled_graph import SETTLED_AFTER_CALLS
from tori.stages import Stage
from tori.testing import count_graphs

# Seconds of timing per model and backend, split into rounds that alternate between
# eager and tori so that machine noise falls on both alike.
TIMING_SECONDS = 0.5
ROUNDS = 5


# Name -> factory of (model in eval mode, example inputs).
DEMO_MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {}


def demo_model(name: str):
    def add(make):
        DEMO_MODELS[name] = make
        return make

    return add


@demo_model("transformer_layer")
def transformer_layer() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
    return layer.eval(), (torch.randn(2, 16, 64),)


@demo_model("small_cnn")
def small_cnn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    cnn = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )
    return cnn.eval(), (torch.randn(4, 3, 32, 32),)


# Stage -> one-line summary of its artifact.
SUMMARIES: dict[Stage, Callable[[str | bytes], str]] = {}


def summary(*stages: Stage):
    def add(fn: Callable[[str | bytes], str]) -> Callable[[str | bytes], str]:
        for stage in stages:
            SUMMARIES[stage] = fn
        return fn

    return add


@summary(Stage.DYNAMO, Stage.ATEN)
def fx_summary(code: str) -> str:
    calls = len(re.findall(r"^\s+\w+ = ", code, re.MULTILINE))
    return f"{len(code.splitlines())} lines of FX Python, {calls} assignments"


@summary(Stage.TORCH, Stage.TORI)
def mlir_summary(mlir: str) -> str:
    # Constants and list constructions are operands, not work: count the ATen ops.
    ops = collections.Counter(re.findall(r"= torch\.aten\.(\w+)", mlir))
    common = ", ".join(f"{op} x{n}" for op, n in ops.most_common(3))
    return f"{len(mlir.splitlines())} lines, {sum(ops.values())} aten ops ({common}, ...)"


@summary(Stage.IREE)
def iree_summary(command: str) -> str:
    flags = [word for word in command.split() if word.startswith("--")]
    target = next((f for f in flags if f.startswith("--iree-hal-target-device=")), "")
    return f"iree-compile with {len(flags)} flags ({target})"


@summary(Stage.VMFB)
def vmfb_summary(vmfb: bytes) -> str:
    return f"{len(vmfb):,} bytes"


def compile_checked(name: str, model: nn.Module, inputs: tuple) -> tuple[Callable, list[tori.CompileRecord]]:
    """Compile with tori (fallback is an error), check against eager, print the stages."""
    seen = {r.name for r in tori.compile_records()}
    # Each model sees one input shape. Without dynamic=False, Dynamo counts the second
    # model's first call as a recompile of the wrapper all compiled modules share, and
    # makes the sizes that differ from the first model's dynamic.
    compiled = torch.compile(model, backend="tori", dynamic=False, options={"fallback": "error"})
    start = time.perf_counter()
    with count_graphs() as count:
        actual = compiled(*inputs)
    seconds = time.perf_counter() - start
    torch.testing.assert_close(actual, model(*inputs), rtol=1e-4, atol=1e-4)
    assert count.compiled_graphs >= 1 and count.fallback_graphs == 0, count.delta
    records = [r for r in tori.compile_records() if r.name not in seen]
    print(f"\n{name}: compiled in {seconds:.1f} s, matches eager")
    for record in records:
        for stage, artifact in record.stages.items():
            print(f"  {stage.value:<7} {SUMMARIES[stage](artifact)}")
    return compiled, records


def drivers(records: list[tori.CompileRecord]) -> str:
    """The IREE driver each graph settled on (tori times local-sync and local-task on the first calls)."""
    return ",".join(sorted({g.compiled.driver for r in records for g in r.graphs if g.compiled and g.compiled.driver}))


def median_ms(fns: dict[str, Callable], inputs: tuple) -> dict[str, float]:
    for fn in fns.values():
        for _ in range(SETTLED_AFTER_CALLS + 4):  # warm-up, and tori's choice of IREE driver
            fn(*inputs)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    deadline_per_round = TIMING_SECONDS / ROUNDS
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            end = time.perf_counter() + deadline_per_round
            while (start := time.perf_counter()) < end:
                fn(*inputs)
                samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) * 1e3 for name, times in samples.items()}


def main() -> None:
    torch.manual_seed(0)
    rows = []
    with torch.no_grad():
        for name, make in DEMO_MODELS.items():
            model, inputs = make()
            compiled, records = compile_checked(name, model, inputs)
            times = median_ms({"eager": model, "tori": compiled}, inputs)
            rows.append((name, times["eager"], times["tori"], drivers(records)))
    print(f"\n{'model':<18} {'eager ms':>9} {'tori ms':>9} {'speedup':>8}  tori driver")
    for name, eager_ms, tori_ms, driver in rows:
        print(f"{name:<18} {eager_ms:>9.3f} {tori_ms:>9.3f} {eager_ms / tori_ms:>7.2f}x  {driver}")


if __name__ == "__main__":
    main()
