"""Where a compiled call's time goes, per IREE dispatch: `tori.profile(fn, *inputs)`
and `tori profile MODULE:FACTORY`.

Each graph tori compiled for the call runs its vmfb under IREE's HAL profiler
(`iree-benchmark-module --device_profiling_mode=...`, with the inputs the call gave
it), `iree-profile statistics` gives each dispatch's time, and the dispatch's MLIR
locations (IREE's flow phase, with debug info) name the torch ops fused into it
and their source lines. Convolutions and matmuls get GFLOP/s from the loop bounds
in IREE's dispatch names, against the machine's fp32 GEMM rate measured here.
"""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from tori.errors import ToriError
from tori.targets.codegen import MATMUL_OPS

log = logging.getLogger("tori.profile")

_PROFILING_MODE = "queue-events,host-execution,executable-metadata"
# `flow.executable.export public @main$async_dispatch_3_matmul_64x256x512_f32`
_EXPORT = re.compile(r"flow\.executable\.export public @([\w$.-]+)")
# `loc("aten.convolution.default"(` and the "file":line frames of a location; ops that
# IREE inlined from one of tori's private functions (passes/packed_matmul.py) carry
# `loc(callsite("aten.mm.default"(...) at ...))`
_OP_LOC = re.compile(r'(?:loc\(|callsite\(|\bat )"((?:aten|prims|tori|torch)\.[\w.]+)"\(')
_FRAME = re.compile(r'"([^"]+)":(\d+):\d+')
_MODULE = re.compile(r'"module ([^"]+)"')
# IREE names a contraction's dispatch by its kind and loop bounds: 2 flops per point.
_CONTRACTION = re.compile(r"_(?:batch_)?(?:matmul|conv|mmt4d|contract)\w*?_((?:\d+x)+\d+)_")


# The torch ops whose dispatches are rated in GFLOP/s (pooling dispatches are also named `conv`).
_CONTRACTING_OPS = ("aten.convolution",) + tuple(sorted(f"aten.{op.__name__.split('.')[0]}" for op in MATMUL_OPS))
_POOLING_OPS = ("aten.max_pool", "aten.avg_pool", "aten.adaptive_avg_pool", "aten._adaptive_avg_pool",
                "aten.adaptive_max_pool")
# A linalg.generic's iterators, and the body up to its yield.
_GENERIC = re.compile(r"linalg\.generic \{[^\n]*?iterator_types = \[([^\]]*)\][^\n]*\n(.*?)linalg\.yield", re.DOTALL)


class ProfileError(ToriError):
    """The profiler could not run or read IREE's profile."""


@dataclass
class DispatchTime:
    name: str
    graph: str
    invocations_per_call: float  # a dispatch function runs once per use (each layer's)
    ops: list[str]
    sources: list[str]  # user source lines of those ops ("model.py:12")
    us_per_call: float
    share: float  # of the graphs' total dispatch time
    gflops: float | None  # convolutions and matmuls
    fraction_of_peak: float | None  # of the machine's fp32 GEMM rate


@dataclass
class Profile:
    wall_us_per_call: float
    dispatch_us_per_call: float
    peak_gflops: float  # the higher of torch.mm's and IREE's fp32 GEMM rates (gemm_rate)
    calls: int
    graphs: list[str]
    dispatches: list[DispatchTime] = field(default_factory=list)
    trace: str | None = None
    torch_gemm_gflops: float | None = None  # the two rates behind peak_gflops
    iree_gemm_gflops: float | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def table(self, limit: int = 30) -> list[list[str]]:
        """Rows for a table, heaviest dispatch first."""
        rows = []
        for d in self.dispatches[:limit]:
            rate = "" if d.gflops is None else f"{d.gflops:.0f} ({d.fraction_of_peak:.0%})"
            rows.append([d.name.split("$async_")[-1], f"{d.us_per_call:.1f}", f"{d.share:.1%}", rate,
                         ", ".join(_short(op) for op in d.ops) or "-", ", ".join(d.sources[:2])])
        return rows


def _short(op: str) -> str:
    return op.removeprefix("aten.").removesuffix(".default")


@lru_cache(maxsize=None)
def _tool(name: str) -> str:
    import iree._runtime_libs

    return str(Path(iree._runtime_libs.__file__).parent / name)


@dataclass(frozen=True)
class GemmRate:
    """The machine's fp32 GEMM rate, measured two ways on its default threads: PyTorch's
    `torch.mm` (its BLAS: MKL's AVX2 path on AMD CPUs, far below the FMA units' rate) and
    IREE's data-tiled matmul compiled by tori for this CPU. The peak is the higher."""

    torch_gflops: float
    iree_gflops: float

    @property
    def peak(self) -> float:
        return max(self.torch_gflops, self.iree_gflops)


def _best_gflops(fn: Callable, flop: float, rounds: int = 5, per_round: int = 4) -> float:
    for _ in range(3):
        fn()
    best = math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(per_round):
            fn()
        best = min(best, (time.perf_counter() - start) / per_round)
    return flop / best / 1e9


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


@lru_cache(maxsize=None)
def gemm_rate(size: int = 1024) -> GemmRate:
    """The fp32 GEMM rate of two size x size matrices: the best of several runs of
    torch.mm and of the same matmul compiled by tori (inference, fallback='error')."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    flop = 2.0 * size ** 3
    eager = _best_gflops(lambda: _matmul(a, b), flop)
    compiled = torch.compile(_matmul, backend="tori", options={"fallback": "error", "driver": "local-task"})
    with torch.no_grad():
        iree = _best_gflops(lambda: compiled(a, b), flop)
    return GemmRate(eager, iree)


@lru_cache(maxsize=None)
def memory_read_gbps(megabytes: int = 256) -> float:
    """The rate at which this machine's default threads read memory: torch's sum of
    a float32 tensor far larger than the caches, the best of several runs."""
    x = torch.randn(megabytes * 2 ** 18)
    return _best_gflops(x.sum, x.numel() * 4.0, rounds=5, per_round=1)


def contraction_gflop(name: str) -> float | None:
    """The work of a convolution or matmul dispatch from its name's loop bounds."""
    match = _CONTRACTION.search(name)
    if match is None:
        return None
    return 2 * math.prod(int(n) for n in match.group(1).split("x")) / 1e9


@dataclass(frozen=True)
class DispatchSource:
    ops: list[str]      # torch ops whose locations the dispatch carries
    sources: list[str]  # their user source lines, or the modules they came from
    contraction: bool   # holds a convolution or matmul (not pooling, which IREE also names `conv`)


def dispatch_ops(flow_text: str) -> dict[str, DispatchSource]:
    """Per dispatch entry point in IREE's flow-phase IR printed with debug info: the
    torch ops whose locations it carries, and their user source lines."""
    found: dict[str, DispatchSource] = {}
    chunks = re.split(r"\n  flow\.executable ", flow_text)
    for chunk in chunks[1:]:
        exports = _EXPORT.findall(chunk)
        ops = list(dict.fromkeys(_OP_LOC.findall(chunk)))
        sources = []
        for file, line in _FRAME.findall(chunk):
            if "site-packages" in file or "/torch/" in file:
                continue
            sources.append(f"{Path(file).name}:{line}")
        sources += _MODULE.findall(chunk)
        pooling = any(op.startswith(_POOLING_OPS) for op in ops) and not _multiplying_reduction(chunk)
        for export in exports:
            # IREE names pooling dispatches `conv` too: a `conv` dispatch is rated only with a
            # convolution in it, and where a pooling's location is in it too (a convolution's
            # transpose back to NCHW can end in the pooling's dispatch, a pooling's result
            # feed the next convolution's), only where a reduction in it multiplies.
            needed = ("aten.convolution",) if "_conv_" in export else _CONTRACTING_OPS
            contraction = any(op.startswith(needed) for op in ops) and not ("_conv_" in export and pooling)
            found[export] = DispatchSource(ops, list(dict.fromkeys(sources)), contraction)
    return found


def _multiplying_reduction(chunk: str) -> bool:
    """Whether a linalg.generic of an executable reduces products (a convolution's
    multiply-add; a pooling's body takes a maximum or a sum)."""
    return any("reduction" in iterators and "arith.mulf" in body for iterators, body in _GENERIC.findall(chunk))


def _capture_arguments(graphs) -> tuple[dict[str, list], Callable[[], None]]:
    """Record the arguments of each compiled graph's next call; returns them and a
    function that restores the graphs' call paths."""
    captured: dict[str, list] = {}
    restore = []
    for graph in graphs:
        compiled = graph.compiled
        original = compiled._call

        def capture(args, compiled=compiled, original=original, name=graph.name):
            captured.setdefault(name, [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args])
            return original(args)

        compiled._call = capture
        restore.append((compiled, original))

    def undo() -> None:
        for compiled, original in restore:
            compiled._call = original

    return captured, undo


def _inputs(graph, args: list, folder: Path) -> list[str]:
    """iree-benchmark-module's --input flags for one call's arguments (the seed of a
    graph with random ops included)."""
    from tori.frontend.signature import ArgKind

    from tori.frontend.resident import SCOPE
    from tori.runtime.artifact import write_parameters

    kinds = graph.compiled.signature.args
    resident = graph.compiled.parameters(args) if ArgKind.RESIDENT in kinds else {}
    values = [a for a, kind in zip(args, kinds) if kind not in (ArgKind.RESIDENT, ArgKind.UNUSED)]
    if ArgKind.SEED in kinds:
        values.append(torch.tensor(0, dtype=torch.int64))
    flags = []
    if resident:  # the module's parameter globals, from an archive of the call's tensors
        archive = folder / "parameters.irpa"
        write_parameters(archive, resident)
        flags.append(f"--parameters={SCOPE}={archive}")
    for index, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            path = folder / f"input_{index}.npy"
            np.save(path, value.detach().cpu().contiguous().numpy())
            flags.append(f"--input=@{path}")
        elif isinstance(value, bool):
            flags.append(f"--input=i1={int(value)}")
        elif isinstance(value, int):
            flags.append(f"--input=i64={value}")
        elif isinstance(value, float):
            flags.append(f"--input=f64={value}")
        else:
            raise ProfileError(f"graph {graph.name}: cannot pass argument {index} ({type(value).__name__}) to "
                               "iree-benchmark-module")
    scratch = graph.compiled.scratch_bytes(args)
    if scratch is not None:  # the module's scratch buffer (runtime/scratch.py): a storage buffer of the tool's
        flags.append(f"--input=&{max(scratch, 64)}xi8")
    return flags


def _run(command: list[str], what: str, timeout_s: float = 600.0) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise ProfileError(f"{what} failed (exit {done.returncode}): {done.stderr.strip()[-600:]}")
    return done.stdout


def _profile_graph(graph, args: list, calls: int, folder: Path) -> list[tuple[str, float, int]]:
    """(dispatch function, total ns, invocations) over `calls` calls of one graph's vmfb
    under IREE's profiler; a function runs once per use (a layer's matmul once per layer)."""
    module = folder / "module.vmfb"
    module.write_bytes(graph.stages["vmfb"])
    output = folder / "profile.ireeprof"
    driver = graph.compiled.driver or "local-task"
    _run([_tool("iree-benchmark-module"), f"--device={driver}", f"--module={module}", "--function=main",
          *_inputs(graph, args, folder), f"--benchmark_min_time={calls}x",
          f"--device_profiling_mode={_PROFILING_MODE}", f"--device_profiling_output={output}"],
         f"iree-benchmark-module on graph {graph.name}")
    rows = []
    for line in _run([_tool("iree-profile"), "statistics", "--format=jsonl", str(output)], "iree-profile").splitlines():
        row = json.loads(line)
        if row.get("row_type") == "host_execution_function" and row.get("function_name"):
            rows.append((row["function_name"], float(row["total_duration_ns"]), int(row["sample_count"])))
    return rows


def _flow_text(graph) -> str:
    from tori.targets.dispatches import recorded_flow_ir

    return recorded_flow_ir(graph, ("--mlir-print-debuginfo",))


def _trace(outputs: list[Path], path: Path) -> None:
    """A Perfetto trace of the profiled calls (iree-profile export, iree-profile-render)."""
    import sys

    try:
        import perfetto  # noqa: F401  (iree-profile-render needs it)
    except ImportError:
        raise ProfileError("--trace needs the 'perfetto' and 'protobuf' packages: pip install perfetto protobuf") from None
    events = path.with_suffix(".ireeperf.jsonl")
    with events.open("w") as out:
        for output in outputs:
            out.write(_run([_tool("iree-profile"), "export", "--format=ireeperf-jsonl", "--output=-", str(output)],
                           "iree-profile export"))
    _run([sys.executable, "-m", "iree._runtime.scripts.iree_profile_render", "--format=perfetto", "--quiet",
          str(events), "-o", str(path)], "iree-profile-render")
    events.unlink()


def profile(fn: Callable, *inputs: Any, calls: int = 20, options: dict | None = None,
            trace: str | Path | None = None) -> Profile:
    """Compile `fn` with tori (fallback='error'), call it with `inputs`, and profile
    every graph of the call on IREE's HAL profiler for `calls` calls."""
    import tori
    from tori.runtime.compiled_graph import CompiledGraph

    if calls < 1:
        raise ProfileError(f"calls must be at least 1, not {calls}")
    seen = {r.name for r in tori.compile_records()}
    compiled = torch.compile(fn, backend="tori", options={"fallback": "error", "cache": False, **(options or {})})
    compiled(*inputs)
    graphs = [g for r in tori.compile_records() if r.name not in seen for g in r.graphs
              if isinstance(g.compiled, CompiledGraph) and g.iree_bytecode is not None]
    if not graphs:
        raise ProfileError("no graph of this call was compiled by tori (nothing to profile)")
    captured, restore = _capture_arguments(graphs)
    try:
        compiled(*inputs)
    finally:
        restore()
    # Past the driver trial (driver="auto" alternates local-sync and local-task on the
    # first calls): the wall time and the profiled driver are those of the choice.
    from tori.runtime.compiled_graph import TRIAL_CALLS_PER_DRIVER

    for _ in range(2 * TRIAL_CALLS_PER_DRIVER + 1):
        compiled(*inputs)
    start = time.perf_counter()
    for _ in range(calls):
        compiled(*inputs)
    wall_us = (time.perf_counter() - start) / calls * 1e6
    gemm = gemm_rate()
    peak = gemm.peak
    times: list[tuple[str, str, float, int]] = []
    located: dict[str, DispatchSource] = {}
    outputs = []
    with tempfile.TemporaryDirectory(prefix="tori-profile-") as tmp:
        for index, graph in enumerate(graphs):
            if graph.name not in captured:
                continue  # not called by this input
            folder = Path(tmp) / str(index)
            folder.mkdir()
            times += [(graph.name, *row) for row in _profile_graph(graph, captured[graph.name], calls, folder)]
            located.update(dispatch_ops(_flow_text(graph)))
            outputs.append(folder / "profile.ireeprof")
        if trace is not None:
            _trace(outputs, Path(trace))
    total = sum(t[2] for t in times) or 1.0
    dispatches = []
    for graph_name, name, ns, invocations in sorted(times, key=lambda t: -t[2]):
        us = ns / calls / 1e3
        source = located.get(name, DispatchSource([], [], False))
        gflop = contraction_gflop(name) if source.contraction else None
        rate = gflop * invocations / (ns * 1e-9) if gflop is not None and ns > 0 else None
        dispatches.append(DispatchTime(name, graph_name, invocations / calls, source.ops, source.sources, us,
                                       ns / total, rate,
                                       rate / peak if rate is not None else None))
    return Profile(wall_us, total / calls / 1e3, peak, calls, [g.name for g in graphs], dispatches,
                   str(trace) if trace is not None else None, gemm.torch_gflops, gemm.iree_gflops)
