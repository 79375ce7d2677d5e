"""tori: an MLIR-based compiler for PyTorch.

`torch.compile(model, backend="tori")` takes a program through TorchDynamo,
AOTAutograd, Torch-MLIR and IREE; this package is the public API around it.

Names are imported on first use, so that `tori.runtime` (running exported
artifacts with only IREE's runtime and numpy) works where PyTorch is not installed.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__version__ = "0.1.0"

if os.environ.get("TORI_LOG"):  # TORI_LOG=info: tori's stages and their times on stderr
    from tori.logs import configure

    configure()

# Public name -> (module, attribute; None for the module itself).
_LAZY: dict[str, tuple[str, str | None]] = {
    "compiler": ("tori.compiler", None),
    "errors": ("tori.errors", None),
    "runtime": ("tori.runtime", None),
    "compile": ("tori.compiler", "compile"),
    "export": ("tori.aot.export", "export"),
    "EntryPoint": ("tori.aot.export", "EntryPoint"),
    "load": ("tori.runtime.artifact", "load"),
    "Driver": ("tori.config", "Driver"),
    "Fallback": ("tori.config", "Fallback"),
    "Options": ("tori.config", "Options"),
    "CompileRecord": ("tori.frontend.records", "CompileRecord"),
    "GraphRecord": ("tori.frontend.records", "GraphRecord"),
    "compile_records": ("tori.frontend.records", "compile_records"),
    "last_compile": ("tori.frontend.records", "last_compile"),
    "STAGES": ("tori.stages", "STAGES"),
    "Stage": ("tori.stages", "Stage"),
    "counters": ("tori.stats", "counters"),
    "Target": ("tori.targets", "Target"),
    "profile": ("tori.tools.profile", "profile"),
}


def __getattr__(name: str) -> Any:
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'tori' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "CompileRecord", "Driver", "EntryPoint", "Fallback", "GraphRecord", "Options", "STAGES", "Stage", "Target",
    "compile", "compile_records", "compiler", "counters", "errors", "export", "last_compile", "load", "profile",
    "runtime",
]
