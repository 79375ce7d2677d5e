"""tori: an MLIR-based compiler for PyTorch.

`torch.compile(model, backend="tori")` takes a program through TorchDynamo,
AOTAutograd, Torch-MLIR and IREE; this package is the public API around it.
"""

from __future__ import annotations

from tori import errors
from tori.config import Driver, Fallback, Options
from tori.frontend.records import CompileRecord, GraphRecord, compile_records, last_compile
from tori.stages import STAGES, Stage
from tori.stats import counters
from tori.targets import Target

__version__ = "0.1.0"


def compile(model=None, *, options: dict | None = None, **torch_compile_kwargs):
    """`torch.compile` with `backend="tori"`; usable as a decorator, on functions and modules."""
    import torch

    torch_compile_kwargs.setdefault("backend", "tori")
    if options is not None:
        Options.from_mapping(options)  # fail here, not at the first call
        torch_compile_kwargs["options"] = options
    if model is None:
        return lambda fn: torch.compile(fn, **torch_compile_kwargs)
    return torch.compile(model, **torch_compile_kwargs)


__all__ = [
    "CompileRecord", "Driver", "Fallback", "GraphRecord", "Options", "STAGES", "Stage", "Target",
    "compile", "compile_records", "counters", "errors", "last_compile",
]
