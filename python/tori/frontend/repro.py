"""Repro files: when a stage fails, the IR it was given and the one command that
reproduces the failure are written next to each other.
"""

from __future__ import annotations

import hashlib
import logging
import shlex
import sys
from pathlib import Path

import torch
import torch.fx

from tori.errors import CompileError
from tori.stages import Stage

log = logging.getLogger("tori.repro")


def _tensor_spec(value) -> str:
    if isinstance(value, torch.Tensor):
        shape = tuple(int(s) if not isinstance(s, torch.SymInt) else int(s.node.hint or 2) for s in value.shape)
        return f"torch.zeros({shape}, dtype={value.dtype})"
    if isinstance(value, torch.SymInt):
        return str(int(value.node.hint or 2))
    return repr(value)


def _fx_script(gm: torch.fx.GraphModule, graph_name: str) -> str:
    specs = [_tensor_spec(n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]
    body = gm.code.strip()
    return "\n".join([
        f"# tori repro: the ATen graph '{graph_name}' that Torch-MLIR's FxImporter failed to import.",
        "import torch",
        "from torch.fx.experimental.proxy_tensor import make_fx",
        "from tori.frontend.importer import import_graph",
        "",
        "",
        "class Repro(torch.nn.Module):",
        *("    " + line for line in body.splitlines()),
        "",
        "",
        f"args = [{', '.join(specs)}]",
        "gm = make_fx(Repro())(*args)",
        f"module, _ = import_graph(gm, graph_name={graph_name!r})",
        "print(module)",
        "",
    ])


def write_repro(error: CompileError, repro_dir: Path, *, gm: torch.fx.GraphModule | None = None,
                mlir: str | None = None, iree_command=None, pipeline: str = "") -> CompileError:
    """Write the failing input of `error.stage` under `repro_dir`; return the error pointing at it."""
    try:
        repro_dir.mkdir(parents=True, exist_ok=True)
        if error.stage in (Stage.ATEN.value, Stage.TORCH.value) and gm is not None:
            text = _fx_script(gm, error.graph)
            path = _unique(repro_dir, error, text, ".py")
            command = shlex.join([sys.executable, str(path)])
        elif mlir is not None:
            path = _unique(repro_dir, error, mlir, ".mlir")
            if error.stage == Stage.IREE.value and iree_command is not None:
                command = iree_command.shell_command(str(path), str(path.with_suffix(".vmfb")))
            else:
                command = shlex.join([sys.executable, "-m", "tori.passes.run", str(path), "--pipeline", pipeline])
        else:
            return error
        path.write_text(mlir if path.suffix == ".mlir" else text)
        path.with_suffix(".txt").write_text(f"{error}\n\nreproduce with:\n  {command}\n")
        return error.with_repro(path, command)
    except OSError as os_error:
        log.warning("could not write the repro file under %s: %s", repro_dir, os_error)
        return error


def _unique(repro_dir: Path, error: CompileError, content: str, suffix: str) -> Path:
    digest = hashlib.sha256(content.encode()).hexdigest()[:12]
    return repro_dir / f"{error.graph or 'graph'}-{error.stage}-{digest}{suffix}"
