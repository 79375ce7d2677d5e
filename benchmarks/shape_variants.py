"""Dynamic-shape latency with tori's shape specialization off and on, in one process.

    .venv/bin/python benchmarks/shape_variants.py [--models cnn_bn,mlp] [--rounds 10] [--seconds 1]

Each model is compiled with `dynamic=True` twice, once with `specialize_shapes=0`
(the dynamic module serves every call) and once with `specialize_shapes=3`, then
called with three recurring batch sizes (warm-up calls let every size earn its static
variant) and one size seen only when timed (the dynamic fallback). Per batch size the
configurations are timed in alternating rounds; the table shows median per-call
times and the ratio off/on, all from this one run.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import MODELS  # noqa: E402

import tori  # noqa: E402
from tori.testing import count_graphs  # noqa: E402

RECURRING = (2, 4, 8)
UNSEEN = 6


def _input(model_name: str, batch: int) -> torch.Tensor:
    example = MODELS[model_name].example_inputs()[0]
    return torch.randn(batch, *example.shape[1:], generator=torch.Generator().manual_seed(batch))


def _timed_calls(fn, x, seconds: float) -> list[float]:
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return times


def measure(model_name: str, rounds: int, seconds: float) -> list[dict]:
    model = MODELS[model_name].build()
    configs = {
        "eager": model,
        "off": torch.compile(copy.deepcopy(model), backend="tori", dynamic=True, options={"fallback": "error", "specialize_shapes": 0}),
        "on": torch.compile(copy.deepcopy(model), backend="tori", dynamic=True, options={"fallback": "error", "specialize_shapes": 3}),
    }
    rows = []
    with torch.no_grad(), count_graphs() as count:
        for _ in range(20):  # driver trials, and specialize_after calls of each recurring size
            for batch in RECURRING:
                x = _input(model_name, batch)
                for name, fn in configs.items():
                    torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
        x = _input(model_name, UNSEEN)
        for fn in configs.values():
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
        for batch in (*RECURRING, UNSEEN):
            x = _input(model_name, batch)
            times = {name: [] for name in configs}
            for _ in range(rounds):
                for name, fn in configs.items():
                    times[name] += _timed_calls(fn, x, seconds / rounds)
            medians = {name: statistics.median(t) * 1e6 for name, t in times.items()}
            rows.append({"model": model_name, "batch": batch, "seen": batch in RECURRING, **medians})
    assert count.fallback_graphs == 0 and count.fallback_calls == 0, count.delta
    assert count.shape_variants == len(RECURRING), count.delta
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cnn_bn,mlp")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=1.0, help="timing per size and configuration")
    args = parser.parse_args()
    print("| model | batch | eager us | tori dynamic (off) us | tori specialized (on) us | off / on |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        torch._dynamo.reset()
        for row in measure(name, args.rounds, args.seconds):
            batch = f"{row['batch']}" + ("" if row["seen"] else " (unseen)")
            print(f"| {row['model']} | {batch} | {row['eager']:.0f} | {row['off']:.0f} | {row['on']:.0f} "
                  f"| {row['off'] / row['on']:.2f}x |")
    tori.compiler.reset()


if __name__ == "__main__":
    main()
