"""The Dynamo backend `tori`: TorchDynamo's FX graph -> AOTAutograd (forward,
backward, inference) -> one compiled IREE module per AOT graph.

Registered through the `torch_dynamo_backends` entry point, so
`torch.compile(model, backend="tori")` works without `import tori`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
import torch._functorch.config
import torch._guards
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.exc import BackendCompilerFailed, RestartAnalysis, SkipFrame

from tori import distributed
from tori.config import Fallback, Options
from tori.errors import CheckFailedError, CompileError, OptionsError, ToriError, ToriRuntimeError, through_dynamo
from tori.frontend import compile_heap
from tori.frontend.alias_outputs import restrider, user_outputs
from tori.frontend.compile_graph import compile_graph
from tori.frontend.constant_origins import ORIGIN, AssumedConstant, assumed_constants
from tori.frontend.decompositions import decomposition_table, tracing_for
from tori.frontend import graph_cache
from tori.frontend.tensor_start_narrow import rewrite_tensor_start_narrows
from tori.frontend.partition import compile_partitioned
from tori.frontend.records import CompileRecord, GraphRecord, new_record
from tori.frontend.resident import mutates
from tori.frontend.repro import write_repro
from tori.logs import stage
from tori.frontend.shape_variants import specialize
from tori.stages import Stage
from tori.stats import counters
from tori.targets import Target
from tori.targets.cpu import resolve_in_background

log = logging.getLogger("tori.backend")

# Exceptions by which Dynamo steers its own tracing; they pass through the backend.
_DYNAMO_CONTROL_FLOW = (RestartAnalysis, SkipFrame)

compile_heap.install()


def tori_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict | None = None, **unknown: Any):
    """Compile one Dynamo graph with tori; options as in `torch.compile(..., options={...})`."""
    compile_heap.install()
    try:
        if unknown:
            raise OptionsError(
                "torch.compile argument for backend 'tori'", sorted(unknown)[0], ["options"], unknown=True,
                hint="tori takes its settings as options={...}; mode= is not supported",
            )
        opts = Options.from_mapping(options)
    except OptionsError as error:
        raise through_dynamo(error) from None
    record = new_record(opts)
    record.dynamo_code = gm.code
    record.rank = distributed.rank()
    record.ddp_bucket = distributed.ddp_bucket()
    rewrite_tensor_start_narrows(gm)
    key, served = graph_cache.lookup(gm, example_inputs, opts, record)
    if served is not None:
        counters.compiled_graphs += 1
        return _unboxed(_boxed(served, gm, opts, record.graphs[-1].name), ())
    if Target.CPU in (opts.target, *opts.targets):
        resolve_in_background(opts.cpu)  # the code generation choice asks for its features
    constants = _dynamo_constants(gm)
    plain = _PlainInference()
    views = user_outputs(gm)
    compilers = {kind: _aot_compiler(record, kind, constants, plain, views)
                 for kind in ("forward", "backward", "inference")}
    try:
        # Effect tokens made and consumed inside the graph (prims._make_token, _sink_tokens)
        # rather than passed as inputs, which AOTAutograd's runtime wrapper sets to None.
        with torch._functorch.config.patch(unlift_effect_tokens=True), stage(record.name, "AOTAutograd and compile"), \
                tracing_for(record.options, gm):
            wrapped = aot_autograd(
                fw_compiler=compilers["forward"],
                bw_compiler=compilers["backward"],
                inference_compiler=compilers["inference"],
                decompositions=decomposition_table(record.options.runtime_checks),
            )(gm, example_inputs)
        direct = plain.direct(len(gm.graph.find_nodes(op="placeholder")))
        if direct is None:
            return wrapped
        if key is not None and plain.whole(record):
            graph_cache.store(key, record.graphs[0], opts, plain.static_args)
        return direct
    except ToriError as error:
        if isinstance(error, BackendCompilerFailed):
            raise
        raise through_dynamo(error) from None
    except _DYNAMO_CONTROL_FLOW:
        raise  # Dynamo asks to re-trace or skip the frame: not a failure of this graph
    except Exception as error:
        # AOTAutograd itself could not trace the graph: the whole Dynamo graph falls back.
        failure = CompileError(f"AOTAutograd failed: {type(error).__name__}: {error}", stage=Stage.ATEN.value, graph=record.name)
        failure.__cause__ = error
        record.error = write_repro(failure, opts.repro_dir, gm=gm)
        return _fall_back(record.error, gm, opts, boxed=False)


def _dynamo_constants(gm: torch.fx.GraphModule) -> list[AssumedConstant]:
    """The tensors Dynamo itself put on the graph module as buffers: the values of
    `assume_constant_result` functions, with the function each came from. The
    module's own parameters and buffers are graph inputs instead (named in
    `dynamo_flat_name_to_original_fqn`)."""
    module_state = gm.meta.get("dynamo_flat_name_to_original_fqn", {})
    return assumed_constants(gm, [name for name, _ in gm.named_buffers(recurse=False) if name not in module_state])


def _use_constants_as_literals(gm: torch.fx.GraphModule, constants: list[AssumedConstant]) -> None:
    """Where an AOT graph input is one of `constants`, read it from an attribute instead.

    AOTAutograd lifts the Dynamo graph's buffers to the first inputs of its forward
    graph (`TracingContext.params_flat`, in order); an attribute reaches the `torch`
    stage as a literal that constant folding can compute with. The input stays in the
    signature, unused, so calls are unchanged. The literal's node keeps where the
    constant came from (meta ORIGIN), for the importer's `tori.assumed_constant`.
    """
    context = torch._guards.TracingContext.try_get()
    lifted = context.params_flat if context is not None and context.params_flat else []
    placeholders = gm.graph.find_nodes(op="placeholder")
    for index, tensor in enumerate(lifted[:len(placeholders)]):
        origin = next((constant for constant in constants if constant.tensor is tensor), None)
        if origin is None:
            continue
        node = placeholders[index]
        if any(mutates(user, node) for user in node.users):
            continue
        name = f"_tori_constant_{index}"
        gm.register_buffer(name, tensor)
        with gm.graph.inserting_after(placeholders[-1]):
            literal = gm.graph.get_attr(name)
        literal.meta = dict(node.meta)
        literal.meta[ORIGIN] = origin
        node.replace_all_uses_with(literal)
    gm.recompile()


class _PlainInference:
    """An inference graph that AOTAutograd's runtime wrapper has nothing to do for.

    The wrapper replays input mutations, regenerates outputs that alias inputs or
    each other, removes duplicated arguments, threads effect tokens and RNG state,
    and wraps tensor subclasses. A graph needing none of that is called directly
    (its parameters and buffers first, as AOTAutograd lifted them), which saves the
    wrapper's per-call work. Dynamo's guards (grad mode, autocast, each tensor's
    properties and aliasing) keep every later call within what was checked here.
    """

    def __init__(self):
        self.compiled: Callable | None = None
        self.lifted: tuple = ()
        self.num_inputs = -1
        self.static_args: frozenset[int] = frozenset()

    def offer(self, compiled: Callable, gm: torch.fx.GraphModule, static_args: frozenset[int]) -> None:
        context = torch._guards.TracingContext.try_get()
        meta = context.fw_metadata if context is not None else None
        if meta is None or not _plain(meta) or torch._C._is_any_autocast_enabled():
            return
        self.compiled = compiled
        self.lifted = tuple(context.params_flat or ())
        self.num_inputs = len(gm.graph.find_nodes(op="placeholder"))
        self.static_args = static_args

    def direct(self, num_dynamo_inputs: int) -> Callable | None:
        """The call without AOTAutograd's wrapper, if the graph takes exactly the lifted
        tensors and Dynamo's inputs (no argument was deduplicated away)."""
        if self.compiled is None or self.num_inputs != len(self.lifted) + num_dynamo_inputs:
            return None
        return _unboxed(self.compiled, self.lifted)

    def whole(self, record: CompileRecord) -> bool:
        """Whether the Dynamo graph compiled as one module: no fallback, partition or
        shape variants, nothing lifted (what the graph cache can serve again)."""
        if self.lifted or len(record.graphs) != 1:
            return False
        graph = record.graphs[0]
        return graph.kind == "inference" and not graph.fell_back and not graph.variants \
            and getattr(self.compiled, "compiled_graph", None) is graph.compiled


def _unboxed(compiled: Callable, lifted: tuple) -> Callable:
    """Dynamo's unboxed call of the boxed `compiled`, the lifted tensors first."""
    if lifted:
        def call(*args):
            return compiled([*lifted, *args])
    else:
        def call(*args):
            return compiled(list(args))
    call.compiled_graph = getattr(compiled, "compiled_graph", None)
    call.without_aot_wrapper = True
    return call


def _plain(meta) -> bool:
    """Whether AOTAutograd's runtime wrapper would only pass arguments and results through."""
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta

    return (
        meta.num_mutated_inp_runtime_indices == 0
        and not any(info.mutates_data or info.mutates_metadata for info in meta.input_info)
        and meta.num_outputs_aliased == 0
        and meta.num_unsafe_view_outputs == 0
        and meta.num_intermediate_bases == 0
        and not meta.tokens
        and not meta.is_rng_op_functionalized
        and meta.num_graphsafe_rng_states == 0
        and meta.grad_enabled_mutation is None
        and not any(isinstance(m, SubclassCreationMeta)
                    for m in (*meta.subclass_inp_meta, *meta.subclass_fw_graph_out_meta))
    )


def _aot_compiler(record: CompileRecord, kind: str, constants: list[AssumedConstant], plain: _PlainInference,
                  views: list) -> Callable:
    def compile_aot_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]):
        restride = restrider(gm, views) if kind != "backward" else None
        compiled = _compile_aot_graph(gm, kind)
        if restride is not None:
            compiled = _restrided(compiled, restride)
        if kind == "inference":
            plain.offer(compiled, gm, _static_inputs(kind))
        return compiled

    def _compile_aot_graph(gm: torch.fx.GraphModule, kind: str):
        if constants and kind != "backward":
            _use_constants_as_literals(gm, constants)
        graph = GraphRecord(name=f"{record.name}_{kind}", kind=kind, dynamo_code=record.dynamo_code)
        record.graphs.append(graph)
        try:
            static_args = _static_inputs(kind)
            compiled = compile_graph(gm, record.options, graph, static_args)
        except CompileError as error:
            graph.error = error
            if record.options.fallback is Fallback.EAGER and record.options.partition:
                partitioned = compile_partitioned(gm, record.options, graph, static_args, error)
                if partitioned is not None:
                    return partitioned
            return _fall_back(error, gm, record.options, boxed=True)
        counters.compiled_graphs += 1
        return _boxed(specialize(compiled, gm, record.options, graph, static_args), gm, record.options, graph.name)

    return compile_aot_graph


def _restrided(compiled: Callable, restride: Callable) -> Callable:
    """`compiled` with its aliased outputs given their traced metadata (alias_outputs.py)."""
    def call(args):
        return restride(args, compiled)

    call._boxed_call = True
    call.compiled_graph = getattr(compiled, "compiled_graph", None)
    return call


def _static_inputs(kind: str) -> frozenset[int]:
    """Indices of the forward graph's inputs that are parameters or buffers."""
    context = torch._guards.TracingContext.try_get()
    if kind == "backward" or context is None or context.fw_metadata is None:
        return frozenset()
    return frozenset(context.fw_metadata.static_input_indices)


def _boxed(compiled, gm: torch.fx.GraphModule, options: Options, name: str) -> Callable:
    # A plain function: Dynamo wraps backward graphs in `disable`, which keeps a
    # function's attributes (here `_boxed_call`) but not an object's class attributes.
    if options.fallback is Fallback.ERROR:
        def run_compiled(args):
            return compiled(args)
    else:
        warned = []

        def run_compiled(args):
            try:
                return compiled(args)
            except CheckFailedError:
                raise  # the inputs' fault: eager raises for them too
            except ToriRuntimeError as error:
                # With fallback 'eager' a call IREE's runtime refuses runs in eager PyTorch
                # (counted); the next call tries the compiled module again.
                if not warned:
                    warned.append(True)
                    log.warning("tori: a call of graph %s runs in eager PyTorch (IREE's runtime failed: %s)",
                                name, str(error).splitlines()[0])
                counters.fallback_calls += 1
                return gm(*args)

    run_compiled._boxed_call = True
    run_compiled.compiled_graph = compiled
    return run_compiled


def _fall_back(error: CompileError, gm: torch.fx.GraphModule, options: Options, *, boxed: bool) -> Callable:
    """Run `gm` in eager PyTorch (counted), or raise when fallback is 'error'.

    AOTAutograd calls its compiled graphs boxed (one list); Dynamo calls unboxed.
    """
    if options.fallback is Fallback.ERROR:
        raise through_dynamo(error)
    counters.fallback_graphs += 1
    where = f"stage '{error.stage}'" + (f", op {error.op}" if error.op else "")
    log.warning(
        "tori: graph %s%s runs in eager PyTorch (%s): %s%s",
        error.graph, distributed.describe(), where, error.reason.splitlines()[0] if error.reason else "",
        f"; repro: {error.command}" if error.command else "",
    )

    def run_eagerly(*args):
        counters.fallback_calls += 1
        return gm(*args)

    if not boxed:
        return run_eagerly

    def run_eagerly_boxed(args):
        counters.fallback_calls += 1
        return gm(*args)

    run_eagerly_boxed._boxed_call = True
    return run_eagerly_boxed
