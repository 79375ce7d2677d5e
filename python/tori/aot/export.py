"""`tori.export`: a model's entry points traced by torch.export, through tori's
pipeline, into one IREE module per target, written as an artifact folder
(docs/export.md): .vmfb files, manifest.json, and optionally a parameter archive,
example inputs with eager outputs, and C sources embedding each module.

The folder is written under a temporary sibling name and renamed when complete.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import importlib.metadata
import logging
import os
import re
import shutil
import subprocess
import sys
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.utils._sympy.numbers import IntInfinity, NegativeIntInfinity

import tori.compiler
from tori.config import Options
from tori.errors import CompileError, OptionsError
from tori.logs import stage
from tori.frontend.constant_origins import ORIGIN, AssumedConstant
from tori.frontend.decompositions import export_table
from tori.frontend.importer import import_graph, new_importer, to_bytecode
from tori.frontend.complex_values import rewrite_complex
from tori.frontend.quantized import STATE_NAME, quantization_summary, rewrite_quantized
from tori.frontend.signature import ArgKind
from tori.passes import run_pipeline
from tori.passes.lower_dialect import lower_for_iree
from tori.runtime import artifact as fmt
from tori.stages import Stage
from tori.targets import Target, codegen, spec
from tori.targets.build import check_compiled_in, compile_with_strategy
from tori.aot.parameters import ExternalParameters, dtype_name
from tori.aot.trace import Traced, check_functional, trace

log = logging.getLogger("tori.export")


@dataclass(frozen=True)
class EntryPoint:
    """One function of an exported module: `method` of the model (a method name, or any
    callable), called with `args` and `kwargs`, with torch.export's `dynamic_shapes`."""

    method: str | Callable = "forward"
    args: tuple = ()
    kwargs: Mapping[str, Any] | None = None
    dynamic_shapes: Any = None

    @classmethod
    def of(cls, value: Any) -> "EntryPoint":
        """An EntryPoint from itself, or a tuple (method, args[, kwargs[, dynamic_shapes]])."""
        if isinstance(value, EntryPoint):
            return value
        if isinstance(value, tuple) and 2 <= len(value) <= 4:
            method, args, *rest = value
            return cls(method, tuple(args) if isinstance(args, (list, tuple)) else (args,), *rest)
        raise OptionsError("entry point", type(value).__name__,
                           ["tori.EntryPoint(method, args, kwargs, dynamic_shapes)", "(method, args)"])


_exports_lock = __import__("threading").Lock()


@contextlib.contextmanager
def _exporting():
    """tori.compiler.is_exporting() is true for the whole of tori.export, the eager reference run included."""
    with _exports_lock:
        tori.compiler._exports_in_progress += 1
    try:
        yield
    finally:
        with _exports_lock:
            tori.compiler._exports_in_progress -= 1


def export(model: Any, args: tuple | None = None, kwargs: Mapping[str, Any] | None = None, *,
           dynamic_shapes: Any = None, targets: tuple[Target | str, ...] | str = ("cpu",),
           output_dir: str | os.PathLike, external_weights: bool = False,
           entry_points: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
           examples: bool = True, c_embed: bool = False, name: str | None = None) -> Path:
    """Export `model` ahead of time and write an artifact folder at `output_dir`.

    With `args`, the one entry point is `forward` (or the callable `model`); with
    `entry_points` ({name: EntryPoint or (method, args)}), one module exports each.
    `external_weights` puts parameters and buffers into `parameters.irpa`, loaded at
    run time. `examples` keeps the example inputs and eager outputs (.npy) in the
    artifact; `c_embed` writes C sources embedding each module (iree-c-embed-data).
    `options` are tori options (pipeline, cpu, vulkan_target, iree_flags, ...).
    Returns the artifact's path.
    """
    if not isinstance(output_dir, (str, os.PathLike)):
        raise OptionsError("output_dir", output_dir, ["a folder path (str or os.PathLike)"],
                           message=f"output_dir must be a folder path, not {type(output_dir).__name__} {output_dir!r}")
    try:
        with warnings.catch_warnings():
            # torch.export's own deprecation notice (its pytree specs), not the user's to act on.
            warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
            return _export(model, args, kwargs, dynamic_shapes=dynamic_shapes, targets=targets,
                           output_dir=output_dir, external_weights=external_weights, entry_points=entry_points,
                           options=options, examples=examples, c_embed=c_embed, name=name)
    except CompileError as error:
        raise error.with_hint(_export_hint(error)) from None


def _export_hint(error: CompileError) -> str:
    """What to do about a failed export: an exported module has no eager fallback."""
    compiling = (Stage.TORCH.value, Stage.TORI.value, Stage.IREE.value, Stage.VMFB.value)
    if error.op is None and error.stage not in compiling:
        return ""  # tracing and checks of the program say in their reason what to change
    hint = ("an exported module has no eager fallback, so every op must compile: see where with "
            "`tori report MODULE:FACTORY` and change the model around that op")
    return hint + (", or report the repro file." if error.repro is not None else ".")


def _export(model: Any, args: tuple | None, kwargs: Mapping[str, Any] | None, *, dynamic_shapes: Any,
            targets: tuple[Target | str, ...] | str, output_dir: str | os.PathLike, external_weights: bool,
            entry_points: Mapping[str, Any] | None, options: Mapping[str, Any] | None, examples: bool,
            c_embed: bool, name: str | None) -> Path:
    opts = Options.from_mapping(options)
    target_list = _targets(targets)
    # One module for every target: the default pass pipeline is the one they share.
    opts = opts.replace(target=target_list[0], targets=target_list[1:])
    check_compiled_in(target_list)
    entries = _entry_points(model, args, kwargs, dynamic_shapes, entry_points)
    output_dir = Path(output_dir)
    name = name or output_dir.name
    with _exporting(), stage(name, "torch.export"):
        traced = {entry: trace(model, point.method, point.args, point.kwargs, point.dynamic_shapes, name=entry)
                  for entry, point in entries.items()}
    hooks = ExternalParameters() if external_weights else None
    importer = new_importer(hooks)
    specs: dict[str, dict] = {}
    symbols: dict[str, dict] = {}
    graphs = []
    for entry, found in traced.items():
        program = found.program.run_decompositions(export_table())
        check_functional(program, name=entry)  # in-place updates show once decomposed
        gm = _stateless(program, found, hooks)
        rewrite_quantized(gm)
        quantization = quantization_summary(gm)
        gm = rewrite_complex(gm, entry)
        graphs.append(gm)
        _, signature = import_graph(gm, graph_name=entry, importer=importer, func_name=_function_name(entry))
        specs[entry] = _entry_spec(entry, program, found, entries[entry], symbols)
        if quantization:
            specs[entry]["quantization"] = quantization
        if ArgKind.SEED in signature.args:
            # The function's last argument seeds its random ops: a fresh value per call.
            specs[entry]["seed"] = {"dtype": "int64", "shape": [], "position": len(specs[entry]["inputs"])}
    module = importer.module
    if opts.tori_pipeline:
        run_pipeline(module, opts.tori_pipeline, graph=name)
    strategy = codegen.choose(graphs, opts, target_list)
    lower_for_iree(module, opts, graph=name, codegen=strategy)
    # Text when IREE's own ops are in it (parameters): their attributes parse only in IREE's context.
    source = str(module).encode() if module.context.allow_unregistered_dialects else to_bytecode(module)
    with stage(name, f"iree-compile ({', '.join(t.value for t in target_list)})"):
        vmfbs = _compile(source, opts, target_list, name, strategy)
    return _write(output_dir, name=name, opts=opts, vmfbs=vmfbs, specs=specs, symbols=symbols, traced=traced,
                  entries=entries, parameters=hooks.tensors if hooks is not None else None, examples=examples,
                  c_embed=c_embed)


def _targets(targets: Any) -> tuple[Target, ...]:
    if isinstance(targets, Target):
        targets = (targets,)
    if not isinstance(targets, (str, list, tuple)):
        raise OptionsError("targets", targets, [t.value for t in Target],
                           message=f"targets must be a target name or a list of them ({', '.join(t.value for t in Target)}), "
                                   f"not {type(targets).__name__} {targets!r}")
    values = targets.replace(",", " ").split() if isinstance(targets, str) else list(targets)
    if not values:
        raise OptionsError("target", "(none)", [t.value for t in Target], hint="export needs at least one target",
                           unknown=True)
    return tuple(dict.fromkeys(Options.from_mapping({"target": v}).target for v in values))


def _entry_points(model, args, kwargs, dynamic_shapes, entry_points) -> dict[str, EntryPoint]:
    if entry_points:
        if args is not None:
            raise OptionsError("export arguments", "args and entry_points", ["one of them"],
                               hint="give the arguments of each entry point in entry_points")
        found = {str(entry): EntryPoint.of(value) for entry, value in entry_points.items()}
    elif args is not None:
        found = {"forward": EntryPoint("forward", tuple(args) if isinstance(args, (list, tuple)) else (args,),
                                       kwargs, dynamic_shapes)}
        if not isinstance(model, torch.nn.Module):
            found["forward"] = EntryPoint(model, found["forward"].args, kwargs, dynamic_shapes)
    else:
        raise OptionsError("export arguments", "none", ["args", "entry_points"])
    for entry in found:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", entry):
            raise OptionsError("entry point name", entry, ["a C identifier, e.g. forward or decode_step"])
    return found


def _function_name(entry: str) -> str:
    return entry


def _stateless(program: torch.export.ExportedProgram, found: Traced, hooks: ExternalParameters | None):
    """The program's graph with parameters, buffers and constants read from attributes
    (imported as literals, or as parameter loads by `hooks`), user inputs as placeholders;
    state the graph does not read is dropped."""
    gm = program.graph_module
    signature = program.graph_signature
    state = {**program.state_dict, **program.constants}
    lifted = {**signature.inputs_to_parameters, **signature.inputs_to_buffers,
              **signature.inputs_to_lifted_tensor_constants}
    weights = set(signature.inputs_to_parameters) | set(signature.inputs_to_buffers)
    for index, node in enumerate(list(gm.graph.find_nodes(op="placeholder"))):
        if node.name not in lifted:
            continue
        if not node.users:  # state the graph never reads (a quantized model's float weights): not kept
            gm.graph.erase_node(node)
            continue
        target = lifted[node.name]
        value = state[target]
        if isinstance(value, torch.nn.Parameter):
            value = value.detach()
        attribute = f"_tori_state_{index}"
        gm.register_buffer(attribute, value)
        if hooks is not None and node.name in weights:
            hooks.add(value, target.removeprefix(found.prefix))
        with gm.graph.inserting_before(node):
            literal = gm.graph.get_attr(attribute)
        literal.meta = dict(node.meta)
        literal.meta[STATE_NAME] = target.removeprefix(found.prefix)
        origin = found.constants.get(id(state[target]))
        if origin is not None:
            literal.meta[ORIGIN] = AssumedConstant(value, origin.qualified, "")
        node.replace_all_uses_with(literal)
        gm.graph.erase_node(node)
    gm.recompile()
    return gm


def _dim(size: Any, names: dict[str, str]) -> int | str:
    if isinstance(size, int):
        return size
    text = str(size)
    return names.get(text, text)


def _user_dim_names(program: torch.export.ExportedProgram, point: EntryPoint) -> dict[str, str]:
    """Symbol (s0) -> the name of the torch.export.Dim the user gave it, where the
    dynamic_shapes spec is positional and its dims are Dim objects."""
    names: dict[str, str] = {}
    spec_ = point.dynamic_shapes
    if spec_ is None:
        return names
    if isinstance(spec_, dict):
        spec_ = tuple(spec_.values())
    inputs = [n for n in program.graph.find_nodes(op="placeholder") if n.name in program.graph_signature.user_inputs]
    for node, dims in zip(inputs, spec_):
        if dims is None or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        items = dims.items() if isinstance(dims, dict) else enumerate(dims)
        for axis, dim in items:
            size = node.meta["val"].shape[axis]
            label = getattr(dim, "__name__", None)
            if label and not isinstance(size, int):
                names.setdefault(str(size), label)
    return names


def _bound(value: Any) -> int | None:
    """A range constraint's bound as an int; None where it is unbounded (torch's int_oo
    says it is finite, sympy's oo does not)."""
    if isinstance(value, (IntInfinity, NegativeIntInfinity)) or not value.is_finite:
        return None
    return int(value)


def _entry_spec(entry: str, program: torch.export.ExportedProgram, found: Traced, point: EntryPoint,
                symbols: dict[str, dict]) -> dict:
    names = _user_dim_names(program, point)
    for symbol, bounds in program.range_constraints.items():
        label = names.get(str(symbol), str(symbol))
        symbols[label] = {"min": _bound(bounds.lower), "max": _bound(bounds.upper)}
    signature = program.graph_signature
    inputs = []
    for node in program.graph.find_nodes(op="placeholder"):
        if node.name not in signature.user_inputs:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            raise CompileError(f"input '{node.name}' is a {type(value).__name__}; exported entry points take tensors",
                               stage=Stage.ATEN.value, graph=entry)
        inputs.append({"name": node.name, "dtype": dtype_name(value.dtype),
                       "shape": [_dim(s, names) for s in value.shape]})
    leaves = pytree.tree_flatten_with_path(found.eager_outputs)[0]
    outputs = []
    output_node = next(iter(program.graph.find_nodes(op="output")))
    output_values = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in output_node.args[0]]
    for index, ((path, eager), value) in enumerate(zip(leaves, output_values)):
        if not isinstance(eager, torch.Tensor) or not isinstance(value, torch.Tensor):
            raise CompileError(f"output {index} is a {type(eager).__name__}; exported entry points return tensors",
                               stage=Stage.ATEN.value, graph=entry)
        label = re.sub(r"\W+", "_", pytree.keystr(path)).strip("_")
        label = label if label and not label[0].isdigit() else f"output_{label or index}"
        outputs.append({"name": "output" if len(leaves) == 1 else label, "dtype": dtype_name(eager.dtype),
                        "shape": [_dim(s, names) for s in value.shape]})
    method = point.method if isinstance(point.method, str) else getattr(point.method, "__qualname__", "callable")
    return {"function": _function_name(entry), "method": method, "tracer": found.tracer,
            "inputs": inputs, "outputs": outputs}


def _format_version(specs: dict[str, dict]) -> int:
    """The lowest format version that describes these entry points: readers before
    version 3 have no complex dtypes, readers before version 2 pass no seed."""
    values = [v for spec in specs.values() for v in (*spec["inputs"], *spec["outputs"])]
    if any(v["dtype"].startswith("complex") for v in values):
        return 3
    return 2 if any("seed" in spec for spec in specs.values()) else 1


def _compile(source: bytes, opts: Options, targets: tuple[Target, ...], name: str,
             strategy: codegen.Strategy) -> dict[Target, tuple[bytes, list[str]]]:
    """Each target's vmfb and iree-compile flags, compiled side by side (as torch.compile
    compiles them: `compile_with_strategy`)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(targets), os.cpu_count() or 1)) as pool:
        futures = {t: pool.submit(compile_with_strategy, source, opts, t, strategy, graph=f"{name}-{t.value}")
                   for t in targets}
        return {t: (vmfb, list(used.flags)) for t, (vmfb, used, _) in ((t, f.result()) for t, f in futures.items())}


def _versions() -> dict[str, str]:
    import tori

    found = {"tori": tori.__version__, "python": sys.version.split()[0]}
    for key, package in (("torch", "torch"), ("torch_mlir", "torch-mlir"), ("iree_compiler", "iree-base-compiler"),
                         ("iree_runtime", "iree-base-runtime")):
        try:
            found[key] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[key] = "unknown"
    return found


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().contiguous().numpy()


def _write(output_dir: Path, *, name: str, opts: Options, vmfbs, specs, symbols, traced, entries, parameters,
           examples: bool, c_embed: bool) -> Path:
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = output_dir.with_name(f".{output_dir.name}.partial-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        files: list[str] = []
        manifest_targets = {}
        for target, (vmfb, flags) in vmfbs.items():
            file = f"{target.value}.vmfb"
            (staging / file).write_bytes(vmfb)
            files.append(file)
            manifest_targets[target.value] = {
                "file": file, "drivers": list(spec(target).drivers), "backend": spec(target).backend,
                "float64": spec(target).float64, "iree_compile_flags": flags}
        manifest_parameters = None
        if parameters is not None:
            file = "parameters.irpa"
            fmt.write_parameters(staging / file, {k: _numpy(v.reshape(-1).view(torch.uint8)) if v.numel()
                                                  else np.zeros(0, np.uint8) for k, v in parameters.items()})
            files.append(file)
            manifest_parameters = {
                "file": file, "scope": fmt.PARAMETER_SCOPE,
                "entries": {k: {"dtype": dtype_name(v.dtype), "shape": list(v.shape)} for k, v in parameters.items()}}
        if examples:
            for entry, found in traced.items():
                folder = Path("examples") / entry
                (staging / folder).mkdir(parents=True)
                tensors = {"inputs": [a for a in pytree.tree_leaves((entries[entry].args, dict(entries[entry].kwargs or {})))
                                      if isinstance(a, torch.Tensor)],
                           "outputs": [o for o in pytree.tree_leaves(found.eager_outputs)]}
                listed = {}
                for kind, values in tensors.items():
                    listed[kind] = []
                    for index, value in enumerate(values):
                        file = (folder / f"{kind[:-1]}_{index}.npy").as_posix()
                        np.save(staging / file, _numpy(value))
                        listed[kind].append(file)
                        files.append(file)
                specs[entry]["examples"] = listed
        manifest_c = {}
        if c_embed:
            for target, info in manifest_targets.items():
                identifier = re.sub(r"\W", "_", f"{name}_{target}_module")
                source, header = f"c/{identifier}.c", f"c/{identifier}.h"
                (staging / "c").mkdir(exist_ok=True)
                embed_c(staging / info["file"], staging / source, staging / header, identifier)
                files += [source, header]
                manifest_c[target] = {"source": source, "header": header, "identifier": identifier}
        manifest = {
            "format": fmt.FORMAT,
            "format_version": _format_version(specs),
            "name": name,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": _versions(),
            "pipeline": opts.tori_pipeline,
            "entry_points": specs,
            "symbols": symbols,
            "targets": manifest_targets,
            "parameters": manifest_parameters,
            "c_embed": manifest_c or None,
            "files": fmt.describe_files(staging, files),
        }
        fmt.write_manifest(staging, manifest)
        fmt.replace_folder(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("exported %s (%s) to %s", name, ", ".join(t.value for t in vmfbs), output_dir)
    return output_dir


def embed_c(vmfb: Path, source: Path, header: Path, identifier: str) -> None:
    """C source and header holding `vmfb` as data (IREE's iree-c-embed-data):
    `const iree_file_toc_t* IDENTIFIER_create()` returns it."""
    tool = shutil.which("iree-c-embed-data", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                                   os.environ.get("PATH", "")]))
    if tool is None:
        raise CompileError("iree-c-embed-data (from iree-base-runtime) is not on PATH", stage=Stage.VMFB.value)
    done = subprocess.run([tool, f"--output_header={header}", f"--output_impl={source}",
                           f"--identifier={identifier}", "--flatten", str(vmfb)], capture_output=True, text=True)
    if done.returncode != 0:
        raise CompileError(f"iree-c-embed-data failed: {done.stderr.strip()}", stage=Stage.VMFB.value)
    # The generated source includes its header by the bare name given to the tool.
    text = source.read_text()
    source.write_text(text.replace(f'#include "{header}"', f'#include "{header.name}"'))
