"""One tori pass judged on the benchmark models: IREE dispatches and latency with
the pass and without it, measured in one process.

Each model is compiled twice by tori, with the base pipeline and with the base
pipeline plus the pass; both are checked against eager; the dispatches IREE forms
for each `tori`-stage module are counted; then eager and both compiled versions are
timed interleaved in rounds (as benchmarks/run.py does) and medians reported.

    python benchmarks/passes.py tori-fuse-attention --models gpt2_decoder,hand_attention [--seconds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tori  # noqa: E402
from tori.config import DEFAULT_PIPELINE  # noqa: E402
from tori.stages import Stage  # noqa: E402
from models import MODELS  # noqa: E402
from run import ATOL, RTOL, WARMUP_CALLS, time_interleaved  # noqa: E402


@dataclass
class PassFigures:
    model: str
    dispatches_without: int
    dispatches_with: int
    eager_ms: float
    without_ms: float
    with_ms: float
    fired: bool

    def row(self) -> str:
        return (f"| {self.model} | {self.dispatches_without} | {self.dispatches_with} | {self.eager_ms:.3f} | "
                f"{self.without_ms:.3f} ({self.eager_ms / self.without_ms:.2f}x) | "
                f"{self.with_ms:.3f} ({self.eager_ms / self.with_ms:.2f}x) | {self.without_ms / self.with_ms:.2f}x |")


HEADER = ("| model | dispatches without | dispatches with | eager ms | tori ms without (vs eager) "
          "| tori ms with (vs eager) | speedup from the pass |\n|---|---|---|---|---|---|---|")


def compiled(model: torch.nn.Module, inputs: tuple, expected: torch.Tensor, pipeline: str):
    """The model compiled with `pipeline`, checked against eager, warmed up; its tori-stage
    IR and its dispatch count as compiled."""
    from tori.targets.dispatches import graph_dispatch_count

    torch._dynamo.reset()
    fn = torch.compile(model, backend="tori", options={"pipeline": pipeline, "fallback": "error"})
    torch.testing.assert_close(fn(*inputs), expected, rtol=RTOL, atol=ATOL)
    record = tori.last_compile()
    dispatches = sum(graph_dispatch_count(g, record.options) for g in record.graphs if g.compiled is not None)
    for _ in range(WARMUP_CALLS):
        fn(*inputs)
    return fn, record.stages[Stage.TORI], dispatches


def measure(pass_name: str, model_name: str, base: str, seconds: float) -> PassFigures:
    spec = MODELS[model_name]
    model, inputs = spec.build(), spec.example_inputs()
    with_pipeline = f"{base}, {pass_name}" if base else pass_name
    with torch.no_grad():
        expected = model(*inputs)
        without_fn, without_ir, without_dispatches = compiled(model, inputs, expected, base)
        with_fn, with_ir, with_dispatches = compiled(model, inputs, expected, with_pipeline)
        times = time_interleaved({"eager": model, "without": without_fn, "with": with_fn}, inputs, seconds)
    ms = {name: statistics.median(samples) * 1e3 for name, samples in times.items()}
    return PassFigures(model_name, without_dispatches, with_dispatches,
                       ms["eager"], ms["without"], ms["with"], with_ir != without_ir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pass_name", help="the tori pass to judge, e.g. tori-fuse-attention")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of: " + ", ".join(MODELS))
    parser.add_argument("--base", default=DEFAULT_PIPELINE,
                        help=f"pipeline the pass is added to (default: {DEFAULT_PIPELINE!r} without the pass)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timing per configuration (default 3.0)")
    args = parser.parse_args(argv)
    base = ", ".join(p.strip() for p in args.base.split(",") if p.strip() and p.strip() != args.pass_name)
    print(f"pass {args.pass_name}, base pipeline {base!r}, torch {torch.__version__}")
    print(HEADER)
    for name in args.models.split(","):
        figures = measure(args.pass_name, name, base, args.seconds)
        print(figures.row() + ("" if figures.fired else " (pass did not change the IR)"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
