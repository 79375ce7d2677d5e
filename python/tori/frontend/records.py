"""What tori keeps of every compilation: per Dynamo graph, the artifacts of every
stage of each AOT graph (forward, backward or inference), and how it ended.
"""

from __future__ import annotations

import collections
import itertools
import threading
from dataclasses import dataclass, field

from tori.config import Options
from tori.errors import CompileError
from tori.stages import Stage, StageArtifacts


@dataclass
class GraphRecord:
    """One AOT graph: 'inference', 'forward' or 'backward'."""

    name: str
    kind: str
    stages: StageArtifacts = field(default_factory=StageArtifacts)
    compiled: object | None = None  # tori.runtime.compiled_graph.CompiledGraph
    error: CompileError | None = None
    compile_seconds: float = 0.0
    passes: list = field(default_factory=list)  # tori.passes.PassRun of each pass run, in order
    # Static-shape variants of a graph with dynamic shapes (option specialize_shapes),
    # in the order they were compiled; a variant's `sizes` are the input sizes it serves.
    variants: list["GraphRecord"] = field(default_factory=list)
    sizes: tuple | None = None
    # Partial fallback (frontend/partition.py): the compiled parts of a graph that runs
    # split, in order of execution, and the ops that run in eager PyTorch between them.
    parts: list["GraphRecord"] = field(default_factory=list)
    eager_ops: tuple[str, ...] = ()
    # For dumps and reports: the Dynamo graph's code, its guards as "source: guard"
    # lines, and the module handed to iree-compile (kept only when dumping or reporting).
    dynamo_code: str = ""
    guards: tuple[str, ...] = ()
    iree_input: str | None = None
    # The compile cache's key of this graph's modules (tori.cache.compile_key), when cached.
    modules_key: str | None = None
    # Served from the compile cache before AOTAutograd traced it (frontend/graph_cache.py).
    from_graph_cache: bool = False
    # The code generation chosen for the graph's op families (tori.targets.codegen.Strategy).
    codegen: object | None = None
    # What iree-compile was given for the main target, with MLIR locations (bytecode), and
    # how it was invoked (tori.targets.iree_compile.IreeInvocation); kept where the graph
    # was compiled rather than served from the cache, for tori.profile.
    iree_bytecode: bytes | None = None
    iree_invocation: object | None = None

    @property
    def fell_back(self) -> bool:
        """Not compiled as a whole: ran eagerly, or partitioned."""
        return self.compiled is None

    @property
    def partitioned(self) -> bool:
        return bool(self.parts)

    @property
    def status(self) -> str:
        """One line on how the graph runs, for reports and summaries."""
        if self.compiled is not None:
            return "compiled"
        if self.partitioned:
            ops = ", ".join(sorted(set(self.eager_ops)))
            return (f"partitioned: {len(self.parts)} compiled part(s), {len(self.eager_ops)} op(s) "
                    f"in eager PyTorch ({ops})")
        return f"fell back: {self.error.reason.splitlines()[0] if self.error else 'not compiled'}"


@dataclass
class CompileRecord:
    """One graph captured by TorchDynamo and everything tori made of it."""

    name: str
    options: Options
    dynamo_code: str = ""
    graphs: list[GraphRecord] = field(default_factory=list)
    error: CompileError | None = None  # set when the whole Dynamo graph fell back
    # Under torch.distributed: the rank that compiled it, and for a piece of a DDP model
    # that Dynamo's DDPOptimizer split at gradient-bucket boundaries, the bucket's index.
    rank: int | None = None
    ddp_bucket: int | None = None

    def graph(self, kind: str) -> GraphRecord | None:
        return next((g for g in self.graphs if g.kind == kind), None)

    @property
    def forward(self) -> GraphRecord | None:
        return self.graph("forward") or self.graph("inference")

    @property
    def backward(self) -> GraphRecord | None:
        return self.graph("backward")

    @property
    def stages(self) -> StageArtifacts:
        """The Dynamo graph, then every stage of its forward (or inference) graph."""
        merged = StageArtifacts()
        if self.dynamo_code:
            merged[Stage.DYNAMO] = self.dynamo_code
        if self.forward is not None:
            for stage, artifact in self.forward.stages.items():
                merged[stage] = artifact
        return merged

    @property
    def fell_back(self) -> bool:
        return self.error is not None or any(g.fell_back for g in self.graphs)


_lock = threading.Lock()
_records: collections.deque[CompileRecord] = collections.deque(maxlen=256)
_ids = itertools.count()


def new_record(options: Options) -> CompileRecord:
    with _lock:
        record = CompileRecord(name=f"graph{next(_ids)}", options=options)
        _records.append(record)
    return record


def last_compile() -> CompileRecord:
    """The record of the most recent graph Dynamo handed to tori."""
    with _lock:
        if not _records:
            raise LookupError("tori has compiled nothing yet in this process (or since tori.compiler.reset())")
        return _records[-1]


def compile_records() -> list[CompileRecord]:
    with _lock:
        return list(_records)


def clear_records() -> None:
    with _lock:
        _records.clear()
