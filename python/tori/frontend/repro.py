"""Repro files: when a stage fails, the IR it was given and the one command that
reproduces the failure are written next to each other.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
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


def _fx_script(gm: torch.fx.GraphModule, graph_name: str, module_path: Path) -> str:
    specs = [_tensor_spec(n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]
    readable = gm.print_readable(print_output=False).strip()
    return "\n".join([
        f"# tori repro: the ATen graph '{graph_name}' that tori failed to import into the torch dialect.",
        "# The graph (pickled beside this file):",
        *("# " + line for line in readable.splitlines()),
        "import torch",
        "import torch._dynamo  # registers every higher-order op the graph may hold",
        "from torch.fx.passes.fake_tensor_prop import FakeTensorProp",
        "from tori.frontend.compile_graph import check_element_types",
        "from tori.frontend.complex_values import rewrite_complex",
        "from tori.frontend.importer import import_graph",
        "",
        f"graph_module = torch.load({str(module_path)!r}, weights_only=False)",
        f"args = [{', '.join(specs)}]",
        "FakeTensorProp(graph_module).propagate(*args)  # the importer reads each node's meta['val']",
        f"graph_module = rewrite_complex(graph_module, {graph_name!r})  # complex values as real pairs",
        f"check_element_types(graph_module, {graph_name!r})  # tori refuses quantized tensors first",
        f"module, _ = import_graph(graph_module, graph_name={graph_name!r})",
        "print(module)",
        "",
    ])


def write_repro(error: CompileError, repro_dir: Path, *, gm: torch.fx.GraphModule | None = None,
                mlir: str | None = None, iree_command=None, pipeline: str = "") -> CompileError:
    """Write the failing input of `error.stage` under `repro_dir`; return the error pointing at it."""
    try:
        repro_dir.mkdir(parents=True, exist_ok=True)
        if error.stage in (Stage.ATEN.value, Stage.TORCH.value) and gm is not None:
            path = _unique(repro_dir, error, gm.code, ".py")
            torch.save(gm, path.with_suffix(".pt"))
            text = _fx_script(gm, error.graph, path.with_suffix(".pt"))
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
    except (OSError, pickle.PicklingError, TypeError, AttributeError) as os_error:
        log.warning("could not write the repro file under %s: %s", repro_dir, os_error)
        return error


def _unique(repro_dir: Path, error: CompileError, content: str, suffix: str) -> Path:
    digest = hashlib.sha256(content.encode()).hexdigest()[:12]
    return repro_dir / f"{error.graph or 'graph'}-{error.stage}-{digest}{suffix}"
