"""Stage dumps: one numbered file per stage of every compiled graph, and an index.

Written when options `dump_dir` (TORI_DUMP_DIR) or `report` are set; large constants
are elided with MLIR's and IREE's own printing limits unless `dump_large_constants`.
"""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path

from tori.cache import graph_key, versions
from tori.config import Options
from tori.distributed import per_rank
from tori.frontend.records import GraphRecord
from tori.stages import Stage

log = logging.getLogger("tori.dump")

# Constants with more elements than this print as `dense_resource<__elided__>` / "...".
ELIDE_ELEMENTS = 16
# Resource blobs (hex strings) longer than this many characters print elided.
ELIDE_RESOURCE_CHARS = 64
INDEX = "index.json"
PHASES = "iree-phases"
_SUFFIX = {Stage.DYNAMO: "py", Stage.ATEN: "py", Stage.TORCH: "mlir", Stage.TORI: "mlir",
           Stage.IREE: "sh", Stage.VMFB: "vmfb"}


def current_guards() -> tuple[str, ...]:
    """The guards Dynamo has collected for the frame being compiled, as "source: kind"
    lines (shape guards are added by Dynamo after the backend returns)."""
    import torch._guards

    context = torch._guards.TracingContext.try_get()
    if context is None or context.guards_context is None:
        return ()
    lines = set()
    for guard in context.guards_context.dynamo_guards:
        try:
            lines.add(f"{guard.name or guard.source.name}: {guard.create_fn_name()}")
        except Exception:  # a guard kind without a printable creator: keep what it says of itself
            lines.add(str(guard).strip().splitlines()[0])
    return tuple(sorted(lines))


def elided(text: str, keep_large_constants: bool = False) -> str:
    """MLIR text printed again with MLIR's limits for large elements and resources."""
    if keep_large_constants or ("dense" not in text and "dialect_resources" not in text):
        return text
    from torch_mlir import ir

    from tori.frontend.importer import new_context

    try:
        module = ir.Module.parse(text, context=new_context())
    except Exception:  # not MLIR (or not parseable here): shown as it is
        return text
    return module.operation.get_asm(large_elements_limit=ELIDE_ELEMENTS,
                                    large_resource_limit=ELIDE_RESOURCE_CHARS, assume_verified=True)


def graph_dir(dump_dir: Path, record: GraphRecord) -> Path:
    """<dump_dir>/<graph>, or <dump_dir>/rank<R>/<graph> under torch.distributed."""
    return per_rank(dump_dir, directory=True) / record.name


def iree_dump_flags(record: GraphRecord, options: Options) -> tuple[str, ...]:
    """iree-compile flags that dump IREE's own phases, when asked for."""
    if options.dump_dir is None or not options.dump_iree_phases:
        return ()
    flags = (f"--dump-compilation-phases-to={graph_dir(options.dump_dir, record) / PHASES}",)
    if not options.dump_large_constants:
        flags += (f"--mlir-elide-elementsattrs-if-larger={ELIDE_ELEMENTS}",
                  f"--mlir-elide-resource-strings-if-larger={ELIDE_RESOURCE_CHARS}")
    return flags


def stage_texts(record: GraphRecord, keep_large_constants: bool = False) -> list[tuple[str, str, str]]:
    """(name, file suffix, text) of every text stage of a graph in pipeline order: the
    Dynamo graph, ATen, torch, the IR after each pass that changed it, tori, the IREE
    input and the iree-compile command."""
    texts: list[tuple[str, str, str]] = []
    if record.dynamo_code:
        texts.append(("dynamo", "py", record.dynamo_code))
    for stage in (Stage.ATEN, Stage.TORCH):
        if stage in record.stages:
            texts.append((stage.value, _SUFFIX[stage], elided(record.stages[stage], keep_large_constants)))
    for number, run in enumerate(record.passes, 1):
        if run.changed and run.ir_after is not None:
            texts.append((f"tori.{number:02d}.{run.step.name}", "mlir", elided(run.ir_after, keep_large_constants)))
    if Stage.TORI in record.stages:
        texts.append(("tori", "mlir", elided(record.stages[Stage.TORI], keep_large_constants)))
    if record.iree_input is not None:
        texts.append(("iree-input", "mlir", elided(record.iree_input, keep_large_constants)))
    if Stage.IREE in record.stages:
        texts.append(("iree", "sh", record.stages[Stage.IREE] + "\n"))
    return texts


def _runnable_iree_script(texts: list[tuple[str, str, str]], record: GraphRecord,
                          options: Options) -> list[tuple[str, str, str]]:
    """The iree stage as a script that compiles an input in the dump: the exact module
    iree-compile was given (`<graph>.mlirbc`, written beside it) where this compile ran
    iree-compile, else the dump's IREE input text."""
    names = [name for name, _, _ in texts]
    if "iree" not in names or "iree-input" not in names:
        return texts
    if record.iree_bytecode is not None:
        source, elision = f"{record.name}.mlirbc", ""
        command = record.stages[Stage.IREE]
    else:  # served by the compile cache: iree-compile did not run here
        source = f"{names.index('iree-input'):02d}-iree-input.mlir"
        command = record.stages[Stage.IREE].replace(f"{record.name}.mlirbc", source)
        elision = "" if options.dump_large_constants else (
            "; its large constants are elided (set dump_large_constants for a byte-exact input)")
    from tori.targets.iree_compile import iree_compile_tool

    tools = shlex.quote(str(Path(iree_compile_tool()).parent))
    script = (f"#!/bin/sh\n# iree-compile as tori ran it (the one tori used, first on PATH), on {source}{elision}.\n"
              f'cd "$(dirname "$0")"\nPATH={tools}:"$PATH"\n{command}\n')
    return [(name, suffix, script if name == "iree" else text) for name, suffix, text in texts]


def dump_graph(record: GraphRecord, options: Options) -> Path:
    """Write <dump_dir>/<graph>/NN-<stage>.<ext> for each stage and index.json."""
    directory = graph_dir(options.dump_dir, record)
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    texts = _runnable_iree_script(stage_texts(record, options.dump_large_constants), record, options)
    for number, (name, suffix, text) in enumerate(texts):
        path = directory / f"{number:02d}-{name}.{suffix}"
        path.write_text(text)
        files.append({"stage": name, "file": path.name})
    if record.iree_bytecode is not None and "iree" in [name for name, _, _ in texts]:
        (directory / f"{record.name}.mlirbc").write_bytes(record.iree_bytecode)  # what NN-iree.sh compiles
    if Stage.VMFB in record.stages:
        path = directory / f"{len(texts):02d}-vmfb.vmfb"
        path.write_bytes(record.stages[Stage.VMFB])
        files.append({"stage": "vmfb", "file": path.name})
    pass_files = {f["stage"]: f["file"] for f in files}
    index = {
        "graph": record.name,
        "kind": record.kind,
        "compiled": record.compiled is not None,
        "status": record.status,
        # Partial fallback: the graphs of its compiled parts, the ops run eagerly between them.
        "parts": [part.name for part in record.parts],
        "eager_ops": list(record.eager_ops),
        "error": None if record.error is None else record.error.reason,
        "compile_seconds": round(record.compile_seconds, 4),
        "guards": list(record.guards),
        "stages": files,
        "passes": [{"step": run.step.text(), "seconds": round(run.seconds, 6), "changed": run.changed,
                    "file": pass_files.get(f"tori.{n:02d}.{run.step.name}")}
                   for n, run in enumerate(record.passes, 1)],
        "iree_phases": sorted(p.name for p in (directory / PHASES).glob("*")) if (directory / PHASES).is_dir() else [],
        # The compile cache's key of this graph (tori/cache.py).
        "content_hash": graph_key(record, options),
        "content_hash_of": "sha256 of the IR after tori's passes, every target's iree-compile flags, the host CPU "
                           "when compiled for 'host', and the versions below",
        "versions": versions(),
    }
    (directory / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return directory


def after_compile(record: GraphRecord, options: Options) -> None:
    """Dump the graph and rewrite the report, as the options ask; never fails a compile."""
    try:
        if options.dump_dir is not None:
            dump_graph(record, options)
        if options.report is not None:
            from tori.tools.report import write_report

            write_report(options.report, options=options)
    except Exception as error:  # noqa: BLE001 - a dump must not change what compiles
        log.warning("could not write the dump or report of %s: %s", record.name, error)
