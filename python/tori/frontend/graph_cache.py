"""Warm starts without AOTAutograd: a Dynamo graph compiled once, in this process or
another, is served from the compile cache before AOTAutograd traces it again.

On a warm start AOTAutograd's tracing (with its decomposition table, built once per
process) is most of what remains of a first call once iree-compile is cached. So
besides the modules, which the compile cache keeps under the key of the IR after
tori's passes (`tori.cache.compile_key`), an entry under a key of Dynamo's graph
names those modules and how calls map onto them.

The key is the Dynamo graph's code, what each input is (type, dtype, shape, strides,
device, whether it is a parameter, which inputs share storage), the global state
AOTAutograd traces under (grad mode, default dtype, deterministic algorithms), the
options that decide the IR and the modules, and the versions and sources of tori and
its dependencies. Only graphs that this describes completely are served:

- static shapes, and tensors only as inputs (no symbolic sizes, no scalars);
- plain inference: no input mutated or aliased by an output, no autograd, no
  autocast (the graph is then called without AOTAutograd's runtime wrapper);
- no module state of Dynamo's own (values of `assume_constant_result`) and no
  submodules (higher-order ops): the code is all there is;
- only torch's own functions and operators: a user's function allowed in the graph
  (`allow_in_graph`) could change without changing the graph's code;
- compiled whole, without partitions or inspection (dumps and reports want every
  stage, which only a compile produces).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Any, Callable

import torch
import torch.fx

from tori.cache import compile_cache, versions
from tori.config import Options
from tori.frontend.input_checks import InputChecks
from tori.frontend.records import CompileRecord, GraphRecord
from tori.frontend.signature import ArgKind, GraphSignature, Result
from tori.frontend.weight_prologue import Prologue
from tori.runtime.targeted import runtime_graph
from tori.stages import Stage
from tori.stats import counters

log = logging.getLogger("tori.graph_cache")

ENTRY_KIND = "dynamo-graph"
# Options that change neither the IR nor the modules: how calls run, where files go.
_RUNTIME_OPTIONS = frozenset({
    "fallback", "partition", "driver", "repro_dir", "compile_timeout_s", "specialize_after",
    "cache", "cache_dir", "cache_max_bytes", "cache_url",
})
# Modules whose functions a Dynamo graph may call and still be described by its code
# (`operator`'s functions report `_operator`).
_KNOWN_MODULES = ("torch", "operator", "math", "_operator", "builtins")
_SIMPLE = (type(None), bool, int, float, str)
# The text stages an entry keeps, so that a served graph's record shows what a compile
# of it shows (tori.last_compile().stages).
_TEXT_STAGES = (Stage.ATEN, Stage.TORCH, Stage.TORI, Stage.IREE)


def graph_key(gm: torch.fx.GraphModule, example_inputs: list[Any], options: Options) -> str | None:
    """The key of `gm` compiled with `options` for these inputs; None when the graph
    is not one this cache can serve."""
    if not _eligible_options(options) or not _eligible_state() or not _eligible_graph(gm):
        return None
    inputs = _describe_inputs(example_inputs)
    if inputs is None:
        return None
    description = {
        "code": gm.code,
        "inputs": inputs,
        "state": {"default_dtype": str(torch.get_default_dtype()),
                  "deterministic": torch.are_deterministic_algorithms_enabled()},
        "options": {f.name: repr(getattr(options, f.name)) for f in dataclasses.fields(options)
                    if f.name not in _RUNTIME_OPTIONS},
        "versions": versions(),
    }
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


def _eligible_options(options: Options) -> bool:
    # Shape variants (specialize_shapes) need no exclusion: a servable graph has static
    # shapes, which tori never specializes.
    return options.cache and options.dump_dir is None and options.report is None and not options.dump_iree_phases


def _eligible_state() -> bool:
    return not torch.is_grad_enabled() and not torch._C._is_any_autocast_enabled()


def _eligible_graph(gm: torch.fx.GraphModule) -> bool:
    if next(gm.children(), None) is not None or next(gm.parameters(), None) is not None \
            or next(gm.buffers(), None) is not None:
        return False
    for node in gm.graph.nodes:
        if node.op in ("call_module", "get_attr"):
            return False
        if node.op == "call_function" and not _known_function(node.target):
            return False
    return True


def _known_function(target: Any) -> bool:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    module = getattr(target, "__module__", None) or ""
    return module.split(".")[0] in _KNOWN_MODULES


def _describe_inputs(example_inputs: list[Any]) -> list | None:
    described, storages = [], {}
    for value in example_inputs:
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            return None
        if any(not isinstance(n, int) for n in (*value.shape, *value.stride(), value.storage_offset())):
            return None
        storage = storages.setdefault(value.untyped_storage().data_ptr(), len(storages))
        described.append([type(value).__name__, str(value.dtype), list(value.shape), list(value.stride()),
                          value.storage_offset(), str(value.device), value.requires_grad, storage])
    return described


# --- entries ------------------------------------------------------------------

def lookup(gm: torch.fx.GraphModule, example_inputs: list[Any], options: Options,
           record: CompileRecord) -> tuple[str | None, Callable | None]:
    """The graph's key (None when not servable) and, on a hit, its compiled graph.

    Never raises: a cache that cannot serve costs a compile, never the call."""
    key = None
    try:
        key = graph_key(gm, example_inputs, options)
        return key, (load(key, options, record) if key is not None else None)
    except Exception as error:  # noqa: BLE001 - anything unexpected: compile as without the cache
        log.warning("tori: the graph cache could not serve %s (%s: %s); compiling", record.name,
                    type(error).__name__, error)
        del record.graphs[:]
        return key, None


def load(key: str, options: Options, record: CompileRecord) -> Callable | None:
    """The compiled graph of `key`, ready to be called with Dynamo's inputs; None on a miss."""
    cache = compile_cache(options)
    found = cache.read(key) if cache is not None else None
    if found is None or found[1].get("kind") != ENTRY_KIND:
        return None
    meta = found[1]
    try:
        signature = _signature_from_json(meta["signature"])
        static_args = frozenset(int(i) for i in meta["static_args"])
        modules_key = str(meta["modules"])
        stages = {Stage(name): str(text) for name, text in meta["stages"].items()}
    except (KeyError, TypeError, ValueError) as error:
        log.warning("tori: graph cache entry %s is unreadable (%s); compiling", key, error)
        return None
    modules = cache.read(modules_key)
    if modules is None:
        return None  # evicted or damaged: the full path compiles (and counts the miss)
    vmfbs = modules[0]
    graph = GraphRecord(name=f"{record.name}_inference", kind="inference", dynamo_code=record.dynamo_code,
                        modules_key=modules_key, from_graph_cache=True)
    for stage, text in stages.items():
        graph.stages[stage] = text
    graph.stages[Stage.VMFB] = vmfbs[options.target]
    graph.compiled = runtime_graph(graph.name, vmfbs, signature, options, static_args)
    record.graphs.append(graph)
    counters.cache_hits += 1
    counters.graph_cache_hits += 1
    return graph.compiled


def store(key: str, graph: GraphRecord, options: Options, static_args: frozenset[int]) -> None:
    """Remember that `key` compiles to `graph`'s modules, when its signature can be written;
    never raises (a failed write costs the next process AOTAutograd, nothing more)."""
    try:
        _store(key, graph, options, static_args)
    except Exception as error:  # noqa: BLE001
        log.warning("tori: could not write the graph cache entry of %s (%s: %s)", graph.name,
                    type(error).__name__, error)


def _store(key: str, graph: GraphRecord, options: Options, static_args: frozenset[int]) -> None:
    cache = compile_cache(options)
    signature = getattr(graph.compiled, "signature", None)
    if cache is None or graph.modules_key is None or not isinstance(signature, GraphSignature) \
            or not cache.local.path(graph.modules_key).exists():
        return  # nothing to serve: no modules, or none written (a full or read-only cache)
    encoded = _signature_to_json(signature)
    if encoded is None:
        return
    stages = {stage.value: graph.stages[stage] for stage in _TEXT_STAGES if stage in graph.stages}
    cache.put(key, {}, {"kind": ENTRY_KIND, "graph": graph.name, "modules": graph.modules_key,
                        "signature": encoded, "static_args": sorted(static_args), "stages": stages})


def _signature_to_json(signature: GraphSignature) -> dict | None:
    results = []
    for result in signature.results:
        if type(result.value) not in _SIMPLE:
            return None
        results.append({"index": result.index, "value": result.value, "updates": result.updates,
                        "dtype": str(result.dtype).removeprefix("torch.") if result.dtype is not None else None})
    return {"args": [kind.value for kind in signature.args], "results": results,
            "num_iree_results": signature.num_iree_results,
            "prologue": signature.prologue.to_json() if signature.prologue is not None else None,
            "input_checks": signature.input_checks.to_json() if signature.input_checks is not None else None}


def _signature_from_json(encoded: dict) -> GraphSignature:
    results = []
    for result in encoded["results"]:
        dtype = result["dtype"]
        if dtype is not None and not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}")
        updates = result.get("updates")
        results.append(Result(result["index"], result["value"], getattr(torch, dtype) if dtype else None,
                              int(updates) if updates is not None else None))
    prologue, checks = encoded.get("prologue"), encoded.get("input_checks")
    return GraphSignature(tuple(ArgKind(kind) for kind in encoded["args"]), tuple(results),
                          int(encoded["num_iree_results"]), Prologue.from_json(prologue) if prologue else None,
                          InputChecks.from_json(checks) if checks else None)
