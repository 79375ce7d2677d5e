"""Partial fallback: an AOT graph that fails to compile because of a few ops is split
around them; its supported regions run as IREE modules, those ops in eager PyTorch.

When `compile_graph` fails with an error naming an op (`error.op`, e.g.
"torch.aten.special_i1e" from iree-compile or "aten.foo.default" from the importer),
`compile_partitioned`:

1. marks the graph's call_function nodes of that op eager (`nodes_of_op`: the
   namespace and overload packet must match; the overload too, when any node has it);
2. splits a copy of the graph with torch.fx's `CapabilityBasedPartitioner`: every
   other node may go into a part, except ops that mutate their inputs or have side
   effects (`copy_` into an input, asserts), which always stay eager and in place,
   and ops on quantized tensors, which tori refuses (complex values compile, as
   real pairs: frontend/complex_values.py);
3. compiles each part that holds at least MIN_PART_OPS compute ops (views,
   `getitem` and symbolic-size arithmetic do not count) with `compile_graph`, each
   with its own GraphRecord `<graph>_part<i>` (in order of execution); smaller
   parts stay in the graph and run eagerly;
4. when a part fails naming another op, adds that op's nodes and starts again from
   step 2 (at most MAX_ROUNDS rounds; unchanged parts come from the compile cache).

It gives up (None: the caller runs the whole graph eagerly, as before) when a failure
names no op or an op no node matches, when no part is left to compile, after
MAX_ROUNDS rounds, or when a part would move across an eager op that mutates an input.

The result is a boxed callable (one list argument, as AOTAutograd calls compiled
graphs): the split `GraphModule`, whose parts are `CompiledPart` modules and whose
other nodes are the original eager calls. A part that IREE's runtime refuses on some
call runs that call eagerly (counted in `fallback_calls`), as a whole graph does.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

import torch
import torch.fx
from torch.fx.node import _side_effectful_functions
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from tori.config import Options
from tori.errors import CompileError, ToriRuntimeError
from tori.frontend.compile_graph import compile_graph
from tori.frontend.records import GraphRecord
from tori.frontend.shape_variants import specialize
from tori.stats import counters
from tori.tools.dump import after_compile

log = logging.getLogger("tori.partition")

# Split-and-compile rounds before the whole graph falls back: each round may add one
# failing op to the eager set.
MAX_ROUNDS = 8
# A part is compiled only with at least this many compute ops; one op is enough, so
# that as much of the graph as possible runs compiled.
MIN_PART_OPS = 1
PART_PREFIX = "part"

_aten = torch.ops.aten
# Ops that compute nothing: a part made only of these is not worth a module.
_NON_COMPUTE = frozenset({
    _aten.view.default, _aten._unsafe_view.default, _aten.reshape.default, _aten.expand.default,
    _aten.permute.default, _aten.t.default, _aten.transpose.int, _aten.squeeze.dim, _aten.squeeze.dims,
    _aten.squeeze.default, _aten.unsqueeze.default, _aten.slice.Tensor, _aten.select.int,
    _aten.alias.default, _aten.detach.default, _aten.sym_size.int, _aten.sym_stride.int,
    _aten.sym_numel.default, _aten.sym_storage_offset.default,
})


def op_name(node: torch.fx.Node) -> str:
    """How reports name a node's op: "aten.special_i1e.default", "higher_order.with_effects"."""
    target = node.target
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


_HIGHER_ORDER = re.compile(r"higher-order op (\w+)")


def _op_key(op: str) -> tuple[str, str, str | None] | None:
    """(namespace, overload packet, overload) of an op as errors name it (Torch-MLIR
    leaves out ".default"; None for a higher-order op):
    "torch.aten.median.dim", "aten.index_reduce.default", "torch.ops.aten.foo",
    "aten foo.default", "higher-order op with_effects"."""
    text = op.strip()
    higher_order = _HIGHER_ORDER.fullmatch(text)
    if higher_order:
        return "higher_order", higher_order.group(1), None
    text = re.sub(r"^(\w+) ", r"\1.", text).removeprefix("torch.ops.").removeprefix("torch.")
    parts = text.split(".")
    if len(parts) < 2 or not all(parts):
        return None
    return parts[0], parts[1], parts[2] if len(parts) > 2 else "default"


def nodes_of_op(gm: torch.fx.GraphModule, op: str | None) -> list[torch.fx.Node]:
    """The call_function nodes of `gm` that run `op` (as a CompileError names it): those of
    its overload, or of any overload of its packet when no node has that one."""
    key = _op_key(op) if op else None
    if key is None:
        return []
    namespace, packet, overload = key
    found = []
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function":
            continue
        if isinstance(target, torch._ops.HigherOrderOperator):
            if namespace == "higher_order" and target.name() == packet:
                found.append(node)
        elif isinstance(target, torch._ops.OpOverload):
            if target.namespace == namespace and target._overloadpacket.__name__ == packet:
                found.append(node)
    exact = [node for node in found if getattr(node.target, "_overloadname", None) == overload]
    return exact or found


def _has_side_effects(node: torch.fx.Node) -> bool:
    """Writes an input (`copy_`), or is an assert or another side-effectful call: such a
    node stays eager."""
    return node.op == "call_function" and (node.target in _side_effectful_functions or _writes(node))


def _writes(node: torch.fx.Node) -> bool:
    """Mutates an input: no part may move across it (an assert may be passed)."""
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def _is_compute(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    target = node.target
    return not (target in _NON_COMPUTE or getattr(target, "__module__", None) in ("_operator", "operator")
                or target in (torch.sym_sum, torch.sym_max, torch.sym_min, torch.sym_not))


def _has_refused_dtype(node: torch.fx.Node) -> bool:
    """Takes or makes a quantized tensor, which tori refuses at the `torch` stage
    (compile_graph.check_element_types): such a node can never be in a part."""
    for value in (node, *node.all_input_nodes):
        meta = value.meta.get("val")
        for tensor in meta if isinstance(meta, (list, tuple)) else (meta,):
            if isinstance(tensor, torch.Tensor) and tensor.is_quantized:
                return True
    return False


class _Supported(OperatorSupportBase):
    def __init__(self, eager: set[str]):
        self.eager = eager

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return (node.op == "call_function" and node.name not in self.eager
                and not _has_side_effects(node) and not _has_refused_dtype(node))


class CompiledPart(torch.nn.Module):
    """One part of a split graph: its IREE module, called boxed; the part's own graph
    serves a call that IREE's runtime refuses."""

    def __init__(self, compiled: Callable, part: torch.fx.GraphModule, name: str):
        super().__init__()
        self.compiled = compiled
        self.part = part
        self.name = name
        self.warned = False

    def forward(self, *args: Any):
        try:
            return self.compiled(list(args))
        except ToriRuntimeError as error:
            if not self.warned:
                self.warned = True
                log.warning("tori: a call of part %s runs in eager PyTorch (IREE's runtime failed: %s)",
                            self.name, str(error).splitlines()[0])
            counters.fallback_calls += 1
            return self.part(*args)


def compile_partitioned(gm: torch.fx.GraphModule, options: Options, record: GraphRecord,
                        static_args: frozenset[int], error: CompileError) -> Callable | None:
    """`gm` split around the op `error` names, its parts compiled; None to fall back whole.

    Fills `record.parts` and `record.eager_ops` and counts the partitioned graph.
    """
    try:
        return _partition(gm, options, record, static_args, error)
    except Exception as failure:  # noqa: BLE001 - splitting is an attempt; the graph still runs eagerly
        log.warning("tori: graph %s could not be partitioned (%s: %s)", record.name, type(failure).__name__, failure)
        return None


def _partition(gm: torch.fx.GraphModule, options: Options, record: GraphRecord,
               static_args: frozenset[int], error: CompileError) -> Callable | None:
    eager: set[str] = set()
    for _ in range(MAX_ROUNDS):
        failing = {node.name for node in nodes_of_op(gm, error.op)} - eager
        if not failing:
            log.debug("partition of %s: failure not attributable to a node (op %s)", record.name, error.op)
            return None
        eager |= failing
        split = split_graph(gm, eager)
        if split is None:
            return None
        try:
            parts = _compile_parts(split, options, record, static_args)
        except CompileError as part_error:
            log.debug("partition of %s: %s", record.name, part_error.reason.splitlines()[0])
            error = part_error
            continue
        if not parts:
            return None
        return _finish(split, parts, record, options, error)
    return None


def split_graph(gm: torch.fx.GraphModule, eager: set[str]) -> torch.fx.GraphModule | None:
    """A copy of `gm` whose supported regions are `part<k>` submodules (tuple outputs);
    None when splitting would move a part across a mutation."""
    graph = torch.fx.Graph()
    values: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, values))
    work = torch.fx.GraphModule(gm, graph)
    _one_user_per_attribute(work.graph)
    partitioner = CapabilityBasedPartitioner(work, _Supported(eager), allows_single_node_partition=True)
    partitions = [p for p in partitioner.propose_partitions()
                  if sum(_is_compute(node) for node in p.nodes) >= MIN_PART_OPS]
    if not partitions:
        return work
    _attach_attributes(work.graph, partitions)
    # By name: fusing may replace the node objects left outside the parts.
    position = {node.name: index for index, node in enumerate(work.graph.nodes)}
    spans = {f"{PART_PREFIX}{k}": (min(position[n.name] for n in p.nodes), max(position[n.name] for n in p.nodes))
             for k, p in enumerate(partitions)}
    fuse_by_partitions(work, [dict(p.nodes) for p in partitions], prefix=PART_PREFIX, always_return_tuple=True)
    if not _side_effects_in_order(work.graph, position, spans):
        return None
    work.recompile()
    return work


def _one_user_per_attribute(graph: torch.fx.Graph) -> None:
    """Give each user of a get_attr node its own get_attr node, so that a part holds the
    constants (and higher-order subgraphs) it reads instead of taking them as inputs."""
    for node in list(graph.find_nodes(op="get_attr")):
        for user in list(node.users)[1:]:
            with graph.inserting_before(user):
                copy = graph.get_attr(node.target)
            copy.meta = dict(node.meta)
            user.replace_input_with(node, copy)


def _attach_attributes(graph: torch.fx.Graph, partitions: list[Partition]) -> None:
    owner = {node: p for p in partitions for node in p.nodes}
    for node in graph.find_nodes(op="get_attr"):
        users = list(node.users)
        if len(users) == 1 and users[0] in owner:
            owner[users[0]].add_node(node)


def _side_effects_in_order(graph: torch.fx.Graph, position: dict[str, int], spans: dict[str, tuple[int, int]]) -> bool:
    """Every part runs wholly before or wholly after each eager node that mutates an
    input, as its nodes did in the original graph."""
    seen_parts: list[str] = []
    for node in graph.nodes:
        if node.op == "call_module" and node.target in spans:
            seen_parts.append(node.target)
        elif _writes(node):
            here = position[node.name]
            before = set(seen_parts)
            if any(spans[p][1] > here for p in before) or any(
                    spans[p][0] < here for p in spans if p not in before):
                return False
    return True


def _compile_parts(split: torch.fx.GraphModule, options: Options, record: GraphRecord, static_args: frozenset[int]) -> list[tuple[str, CompiledPart, GraphRecord]]:
    placeholders = {node.name: index for index, node in enumerate(split.graph.find_nodes(op="placeholder"))}
    parts = []
    for node in split.graph.find_nodes(op="call_module"):
        if not node.target.startswith(PART_PREFIX):
            continue
        part_gm = getattr(split, node.target)
        static = frozenset(i for i, arg in enumerate(node.args)
                           if isinstance(arg, torch.fx.Node) and arg.op == "placeholder"
                           and placeholders[arg.name] in static_args)
        part_record = GraphRecord(name=f"{record.name}_part{len(parts)}", kind=record.kind,
                                  dynamo_code=record.dynamo_code)
        compiled = compile_graph(part_gm, options, part_record, static)
        runnable = specialize(compiled, part_gm, options, part_record, static)
        parts.append((node.target, CompiledPart(runnable, part_gm, part_record.name), part_record))
    return parts


def _finish(split: torch.fx.GraphModule, parts: list, record: GraphRecord, options: Options,
            error: CompileError) -> Callable:
    for target, module, _ in parts:
        setattr(split, target, module)
    record.parts = [part_record for _, _, part_record in parts]
    record.eager_ops = tuple(op_name(node) for node in split.graph.nodes if _is_compute(node))
    counters.partitioned_graphs += 1
    counters.compiled_parts += len(parts)
    counters.eager_ops += len(record.eager_ops)
    first = record.error or error
    log.warning("tori: graph %s runs partitioned: %d part(s) compiled, %d op(s) in eager PyTorch (%s); "
                "the first failure was at stage '%s', op %s: %s%s",
                record.name, len(parts), len(record.eager_ops), ", ".join(sorted(set(record.eager_ops))),
                first.stage, first.op, first.reason.splitlines()[0],
                f"; repro: {first.command}" if first.command else "")
    if options.dump_dir is not None or options.report is not None:
        after_compile(record, options)  # the graph's dump and the report now show its parts

    def run_partitioned(args):
        counters.partitioned_calls += 1
        return split(*args)

    run_partitioned._boxed_call = True
    run_partitioned.split_graph = split
    return run_partitioned
