"""One AOT graph through the stages torch -> tori -> iree -> vmfb, into a CompiledGraph.

Any failure becomes a CompileError with a repro file; the caller decides between
falling back to eager and raising.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import replace

import torch.fx

from tori.cache import compile_cache, compile_key
from tori.config import Options
from tori.errors import CompileError
from tori.frontend.complex_values import rewrite_complex
from tori.frontend.importer import import_graph, new_importer, to_bytecode
from tori.frontend.input_checks import split as input_checks_of
from tori.frontend.quantized import rewrite_quantized
from tori.frontend.shared_heads import share_repeated_heads
from tori.frontend.signature import in_place_updates, with_updates
from tori.frontend.resident import make_resident, resident_args, unused_args, with_resident
from tori.frontend.records import GraphRecord
from tori.frontend.repro import write_repro
from tori.logs import stage, stage_log
from tori.passes import PassError, run_pipeline
from tori.passes.lower_dialect import lower_for_iree
from tori.runtime.compiled_graph import CompiledGraph
from tori.runtime.targeted import runtime_graph
from tori.stages import Stage
from tori.targets import codegen
from tori.targets.build import OtherTargets, compile_with_strategy, compiled_targets, in_process_flags
from tori.targets.build import invocation as build_invocation
from tori.tools.dump import after_compile, current_guards, iree_dump_flags

log = logging.getLogger("tori.compile")


def compile_graph(gm: torch.fx.GraphModule, options: Options, record: GraphRecord,
                  static_args: frozenset[int] = frozenset()) -> CompiledGraph:
    """Compile one functional ATen graph; raise CompileError (with its repro) on failure.

    `static_args` are the indices of inputs that are parameters or buffers.
    """
    start = time.perf_counter()
    inspecting = options.dump_dir is not None or options.report is not None
    rewrite_quantized(gm)
    share_repeated_heads(gm)
    record.stages[Stage.ATEN] = gm.code
    if inspecting:
        record.guards = current_guards()
    module = None
    invocation = None
    try:
        gm = rewrite_complex(gm, record.name)  # a copy: the caller's graph stays complex for eager fallback
        record.stages[Stage.ATEN] = gm.code
        check_element_types(gm, record.name)
        gm, input_checks = input_checks_of(gm)
        resident = resident_args(gm, record.kind, options, static_args, inspecting)
        unused = unused_args(gm)
        with stage(record.name, "import to the torch dialect (Torch-MLIR)"):
            if resident or unused:
                source, hooks, prologue = make_resident(gm, resident, unused)
                module, signature = import_graph(source, graph_name=record.name,
                                                 importer=new_importer(hooks) if resident else None)
                signature = replace(with_resident(signature, resident, unused), prologue=prologue)
            else:
                module, signature = import_graph(gm, graph_name=record.name)
        signature = replace(with_updates(signature, in_place_updates(gm)), input_checks=input_checks)
        record.stages[Stage.TORCH] = str(module)
        if options.tori_pipeline:
            with stage(record.name, "tori passes"):
                runs = run_pipeline(module, options.tori_pipeline, graph=record.name,
                                    text=record.stages[Stage.TORCH])
            record.stages[Stage.TORI] = runs[-1].ir_after if runs else record.stages[Stage.TORCH]
            record.passes = [run if inspecting else replace(run, ir_after=None) for run in runs]
        else:
            record.stages[Stage.TORI] = record.stages[Stage.TORCH]
        # IREE's phase dumps come from compiling, so asking for them bypasses the cache.
        cache = None if options.dump_iree_phases else compile_cache(options)
        record.codegen = codegen.choose(gm, options, compiled_targets(options))
        own_flags = in_process_flags(options)
        key = compile_key(record.stages[Stage.TORI], options, record.codegen, own_flags) if cache is not None else None
        record.modules_key = key
        invocation = build_invocation(options, options.target, own_flags + iree_dump_flags(record, options),
                                      record.codegen)
        record.stages[Stage.IREE] = invocation.shell_command(f"{record.name}.mlirbc", f"{record.name}.vmfb")
        with cache.single_flight(key, options.cache_wait_s) if cache is not None else nullcontext() as vmfbs:
            if vmfbs is not None:
                stage_log.info("%s: served by the compile cache", record.name)
            if vmfbs is None or inspecting:
                lower_for_iree(module, options, graph=record.name, text=record.stages[Stage.TORI],
                               codegen=record.codegen)
            if inspecting:
                record.iree_input = str(module)
            if vmfbs is None:
                # IREE's own ops (resident weights' globals, tori-widen-16-bit's barriers) parse only in
                # IREE's context: text then.
                bytecode = module.operation.get_asm(enable_debug_info=True).encode() \
                    if module.context.allow_unregistered_dialects else to_bytecode(module)
                others = OtherTargets(bytecode, options, record.name, record.stages[Stage.TORI], record.codegen)
                with stage(record.name, f"iree-compile ({options.target.value})"):
                    vmfb, invocation = _compile_main_target(bytecode, options, record, own_flags)
                record.iree_bytecode, record.iree_invocation = bytecode, invocation
                vmfbs = {options.target: vmfb, **others.result()}
                if cache is not None:
                    cache.put(key, vmfbs, {"graph": record.name, "kind": record.kind})
        record.stages[Stage.VMFB] = vmfbs[options.target]
        compiled = runtime_graph(record.name, vmfbs, signature, options, static_args)
        record.compiled = compiled
    except PassError as error:
        record.error = write_repro(error, options.repro_dir, gm=gm, mlir=error.ir_before, pipeline=error.step)
        raise record.error
    except CompileError as error:
        failing_ir = record.stages[Stage.TORI] if Stage.TORI in record.stages else (
            record.stages[Stage.TORCH] if Stage.TORCH in record.stages else None)
        if error.stage == Stage.IREE.value and module is not None:
            failing_ir = str(module)  # what iree-compile was given: the tori dialect lowered away
        record.error = write_repro(error, options.repro_dir, gm=gm, mlir=failing_ir,
                                   iree_command=getattr(error, "invocation", invocation),
                                   pipeline=options.tori_pipeline)
        raise record.error
    finally:
        record.compile_seconds = time.perf_counter() - start
        if inspecting:
            after_compile(record, options)
    log.info("compiled %s (%s) in %.2f s", record.name, record.kind, record.compile_seconds)
    return compiled


def _compile_main_target(bytecode: bytes, options: Options, record: GraphRecord, flags: tuple[str, ...]):
    """iree-compile for the main target (`compile_with_strategy`: where the strategy's
    flags fail, IREE's other data-tiling path, then its defaults); the strategy used
    and its command are recorded. Returns the vmfb and the invocation that made it."""
    vmfb, used, record.codegen = compile_with_strategy(bytecode, options, options.target, record.codegen,
                                                       graph=record.name,
                                                       extra=flags + iree_dump_flags(record, options))
    record.stages[Stage.IREE] = used.shell_command(f"{record.name}.mlirbc", f"{record.name}.vmfb")
    return vmfb, used


def check_element_types(gm: torch.fx.GraphModule, graph: str) -> None:
    """Refuse quantized tensors before Torch-MLIR and IREE see them: they have no
    lowering at all. (Complex values are real pairs by now, rewrite_complex, but for
    the graph's own inputs and results, which IREE's torch input takes apart.)"""
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        for tensor in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(tensor, torch.Tensor) and tensor.is_quantized:
                op = f"aten {getattr(node.target, '__name__', node.target)}" if node.op == "call_function" else None
                raise CompileError(f"{tensor.dtype} tensors are not supported by tori (value '{node.name}'); "
                                   "quantized dtypes have no lowering to IREE",
                                   stage=Stage.TORCH.value, graph=graph, op=op)
