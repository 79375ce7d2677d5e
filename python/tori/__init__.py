"""tori: an MLIR-based compiler for PyTorch.

`torch.compile(model, backend="tori")` takes a program through TorchDynamo,
AOTAutograd, Torch-MLIR and IREE; this package is the public API around it.
"""

from __future__ import annotations

from tori import compiler, errors
from tori.compiler import compile
from tori.config import Driver, Fallback, Options
from tori.frontend.records import CompileRecord, GraphRecord, compile_records, last_compile
from tori.stages import STAGES, Stage
from tori.stats import counters
from tori.targets import Target

__version__ = "0.1.0"


__all__ = [
    "CompileRecord", "Driver", "Fallback", "GraphRecord", "Options", "STAGES", "Stage", "Target",
    "compile", "compile_records", "compiler", "counters", "errors", "last_compile",
]
