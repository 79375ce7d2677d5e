"""Every pass a tori pipeline can name, with one line of description each: tori's
registry and the upstream MLIR and Torch-MLIR passes that torch-mlir's bindings register.

The bindings list no passes, so the candidates come from the `--help` of the
`torch-mlir-opt` and `iree-opt` tools installed beside them, and each is kept only
if torch-mlir's own PassManager parses it.
"""

from __future__ import annotations

import difflib
import logging
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from torch_mlir.passmanager import PassManager

from tori.passes.registry import registered_passes

log = logging.getLogger("tori.passes")

# `      --canonicalize     -   Canonicalize operations` in a tool's --help.
_HELP_LINE = re.compile(r"^      --([\w-]+)\s+-\s+(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class PassInfo:
    name: str
    description: str
    origin: str  # "tori", "torch-mlir" or "mlir"


def _tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def _help_passes(tool: str | None) -> dict[str, str]:
    if tool is None:
        return {}
    try:
        text = subprocess.run([tool, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("could not list the passes of %s: %s", tool, error)
        return {}
    listed = text.split("Passes:", 1)[-1]
    return {name: description.strip() for name, description in _HELP_LINE.findall(listed)}


def _parses(name: str) -> bool:
    for pipeline in (f"builtin.module({name})", f"builtin.module(func.func({name}))"):
        try:
            PassManager.parse(pipeline)
            return True
        except ValueError:
            continue
    return False


@lru_cache(maxsize=1)
def known_passes() -> dict[str, PassInfo]:
    """Pass name -> PassInfo, tori's first, then the rest by name."""
    from tori.frontend.importer import new_context

    passes = {name: PassInfo(name, p.description, "tori") for name, p in sorted(registered_passes().items())}
    torch_mlir_passes = _help_passes(_tool("torch-mlir-opt"))
    candidates = {**_help_passes(_iree_opt()), **torch_mlir_passes}
    with new_context():
        for name in sorted(candidates):
            if name not in passes and _parses(name):
                origin = "torch-mlir" if name.startswith("torch") else "mlir"
                passes[name] = PassInfo(name, candidates[name], origin)
    return passes


def _iree_opt() -> str | None:
    try:
        from iree.compiler.tools.binaries import find_tool

        return find_tool("iree-opt")
    except Exception:  # noqa: BLE001 - IREE's tools are optional for listing passes
        return _tool("iree-opt")


def closest_passes(name: str, count: int = 3) -> list[str]:
    """The registered pass names closest to `name`, best first."""
    names = list(known_passes())
    close = difflib.get_close_matches(name, names, n=count, cutoff=0.6)
    return close or [n for n in names if name in n or n in name][:count]
