"""A/B experiments on the pipeline: one model compiled with several variants (a tori
pass pipeline and extra iree-compile flags each), every variant checked against eager,
its IREE dispatches counted, and all timed interleaved in one process so ratios compare.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from tori.config import Options
from tori.errors import OptionsError
from tori.frontend.records import CompileRecord, compile_records

log = logging.getLogger("tori.explore")

RTOL = 1e-4
ATOL = 1e-4
ROUNDS = 10
WARMUP_CALLS = 12  # enough for tori's driver trials on both CPU drivers


@dataclass(frozen=True)
class Variant:
    pipeline: str
    iree_flags: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        flags = " ".join(self.iree_flags)
        return (self.pipeline or "(no passes)") + (f" | {flags}" if flags else "")


@dataclass
class Outcome:
    variant: Variant
    correct: bool = False
    max_error: float | None = None
    dispatches: int | None = None
    compile_s: float | None = None
    median_ms: float | None = None
    ratio: float | None = None  # median latency / the first variant's
    fell_back: str | None = None  # why a graph ran in eager PyTorch instead
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["variant"] = {"pipeline": self.variant.pipeline, "iree_flags": list(self.variant.iree_flags),
                           "label": self.variant.label}
        return data


def variants(pipelines: list[str], iree_flags: list[str]) -> list[Variant]:
    """Pair `--pipeline` and `--iree-flags` values in order; a single value of either
    applies to every variant."""
    pipelines = pipelines or [Options().tori_pipeline]
    flags = iree_flags or [""]
    count = max(len(pipelines), len(flags))
    if len(pipelines) not in (1, count) or len(flags) not in (1, count):
        raise OptionsError("number of --iree-flags", len(flags), [f"1 or {len(pipelines)} (one per --pipeline)"])
    pipelines = pipelines * count if len(pipelines) == 1 else pipelines
    flags = flags * count if len(flags) == 1 else flags
    return [Variant(p, tuple(f.split())) for p, f in zip(pipelines, flags)]


def _max_error(actual: Any, expected: Any) -> float:
    actual_leaves = torch.utils._pytree.tree_leaves(actual)
    expected_leaves = torch.utils._pytree.tree_leaves(expected)
    errors = [(a.double() - e.double()).abs().max().item() if a.numel() else 0.0
              for a, e in zip(actual_leaves, expected_leaves) if isinstance(e, torch.Tensor)]
    return max(errors, default=0.0)


def _dispatches(records: list[CompileRecord], options: Options) -> int | None:
    from tori.targets.dispatches import graph_dispatch_count

    graphs = [g for r in records for g in r.graphs if g.compiled is not None]
    if not graphs:
        return None
    return sum(graph_dispatch_count(graph, options) for graph in graphs)


def _prepare(model: Callable, inputs: tuple, expected: Any, variant: Variant,
             base: dict[str, Any]) -> tuple[Callable | None, Outcome]:
    outcome = Outcome(variant)
    seen = {r.name for r in compile_records()}
    options = Options.from_mapping({**base, "pipeline": variant.pipeline,
                                    "iree_flags": tuple(base.get("iree_flags", ())) + variant.iree_flags})
    try:
        fn = torch.compile(model, backend="tori", options={**base, "pipeline": options.pipeline,
                                                             "iree_flags": options.iree_flags})
        start = time.perf_counter()
        actual = fn(*inputs)
        outcome.compile_s = time.perf_counter() - start
        outcome.max_error = _max_error(actual, expected)
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
        outcome.correct = True
        for _ in range(WARMUP_CALLS):
            fn(*inputs)
    except AssertionError:
        pass  # a wrong result is reported, and the variant still timed
    except Exception as error:  # noqa: BLE001 - one failing variant must not end the experiment
        outcome.error = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        return None, outcome
    records = [r for r in compile_records() if r.name not in seen]
    failures = [g.error for r in records for g in r.graphs if g.error and not g.partitioned] + [
        r.error for r in records if r.error]
    partitioned = [g.status for r in records for g in r.graphs if g.partitioned]
    if failures or not records:
        outcome.fell_back = failures[0].reason.splitlines()[0] if failures else "nothing was compiled"
    elif partitioned:
        outcome.fell_back = partitioned[0]
    try:
        outcome.dispatches = _dispatches(records, options)
    except Exception as error:  # noqa: BLE001
        log.warning("could not count the dispatches of %s: %s", variant.label, error)
    return fn, outcome


def explore(model: Callable, inputs: tuple, variant_list: list[Variant], *, seconds: float = 2.0,
            options: dict[str, Any] | None = None) -> list[Outcome]:
    """Compile `model` with each variant, check it against eager and time all of them
    interleaved for about `seconds` in total; ratios are to the first variant."""
    base = dict(options or {})
    base.setdefault("fallback", "eager")
    for variant in variant_list:  # every pipeline checked before anything compiles
        Options.from_mapping({**base, "pipeline": variant.pipeline, "iree_flags": variant.iree_flags})
    outcomes: list[Outcome] = []
    ready: dict[int, Callable] = {}
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=max(8, 2 * len(variant_list) + 2)):
        expected = model(*inputs)
        for index, variant in enumerate(variant_list):
            fn, outcome = _prepare(model, inputs, expected, variant, base)
            log.info("variant %d (%s): %s", index, variant.label, outcome.error or
                     f"compiled in {outcome.compile_s or 0:.2f} s, {'correct' if outcome.correct else 'DIFFERS'}")
            outcomes.append(outcome)
            if fn is not None:
                ready[index] = fn
        times: dict[int, list[float]] = {i: [] for i in ready}
        clock = time.perf_counter
        per_round = seconds / ROUNDS / max(len(ready), 1)
        for _ in range(ROUNDS):
            for index, fn in ready.items():
                end = clock() + per_round
                while (start := clock()) < end:
                    fn(*inputs)
                    times[index].append(clock() - start)
    for index, samples in times.items():
        if samples:
            outcomes[index].median_ms = statistics.median(samples) * 1e3
            log.info("variant %d: median %.3f ms over %d calls", index, outcomes[index].median_ms, len(samples))
    first = outcomes[0].median_ms if outcomes else None
    for outcome in outcomes:
        if first and outcome.median_ms is not None:
            outcome.ratio = outcome.median_ms / first
    return outcomes
