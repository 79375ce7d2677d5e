"""Resident weights: in inference on the CPU, a graph's parameters and buffers become
IREE globals initialised from a parameter index when the module is loaded, instead of
arguments of every call.

IREE hoists what is computed from immutable globals into the module's initializer:
with data tiling, the packing of each weight into the matmul's tiled layout then runs
once per load, not once per call (it was 17% of DeiT-small's and 22% of BERT's
dispatch time, docs/performance.md). The runtime (tori.runtime.compiled_graph) checks
on each call that every resident tensor is the one loaded, unchanged (same tensor,
storage and version), and reloads the module with the current values otherwise.
"""

from __future__ import annotations

from copy import deepcopy

import torch
import torch.fx

from tori.aot.parameters import BUILTIN_ELEMENT, ExternalParameters
from tori.frontend import weight_prologue
from tori.frontend.import_copies import import_copy
from tori.frontend.weight_prologue import Prologue, derived_name
from tori.config import Options
from tori.runtime.artifact import PARAMETER_SCOPE as SCOPE  # the scope ExternalParameters names
from tori.targets import Target
from tori.targets.build import compiled_targets



def parameter_name(index: int) -> str:
    return f"arg{index}"


def mutates(user: torch.fx.Node, node: torch.fx.Node) -> bool:
    """Whether `user` writes `node` (an argument its schema marks as written)."""
    schema = getattr(user.target, "_schema", None)
    return schema is not None and any(
        argument.alias_info is not None and argument.alias_info.is_write and value is node
        for argument, value in zip(schema.arguments, user.args))


def resident_args(gm: torch.fx.GraphModule, kind: str, options: Options, static_args: frozenset[int],
                  inspecting: bool) -> frozenset[int]:
    """The inputs of `gm` that are kept in the module: parameters and buffers of an
    inference graph compiled for the CPU alone, of a dtype IREE globals hold and of
    static shape, that the graph neither writes nor returns."""
    if not options.resident_weights or kind != "inference" or not static_args or inspecting \
            or compiled_targets(options) != (Target.CPU,):
        return frozenset()
    if any(n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator) for n in gm.graph.nodes):
        return frozenset()  # FxImporter imports a literal passed into a subgraph twice
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = set(output.all_input_nodes)
    # Inputs AOTAutograd writes back after the call (BatchNorm's running statistics in
    # training mode under no_grad): a global would be stale at once.
    context = torch._guards.TracingContext.try_get()
    meta = context.fw_metadata if context is not None else None
    written = {i for i, info in enumerate(meta.input_info) if info.mutates_data or info.mutates_metadata} \
        if meta is not None else set()
    chosen = set()
    for index, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        value = node.meta.get("val")
        if index not in static_args or index in written or not isinstance(value, torch.Tensor) \
                or value.dtype not in BUILTIN_ELEMENT:
            continue
        if not all(isinstance(d, int) for d in value.shape) or node in returned or not node.users:
            continue
        if any(mutates(user, node) for user in node.users):
            continue
        # FxImporter binds a get_attr node's value at each reference and refuses a second:
        # each use gets a get_attr node of its own, which an op naming the tensor twice defeats.
        if any(sum(arg is node for arg in user.all_input_nodes) > 1 or
               len([a for a in (*user.args, *user.kwargs.values()) if a is node]) > 1 for user in node.users):
            continue
        chosen.add(index)
    return frozenset(chosen)


def unused_args(gm: torch.fx.GraphModule) -> frozenset[int]:
    """The tensor inputs of `gm` that nothing reads (a weight-only int8 layer's zero
    points): left out of the module's signature and never passed."""
    return frozenset(i for i, node in enumerate(gm.graph.find_nodes(op="placeholder"))
                     if not node.users and isinstance(node.meta.get("val"), torch.Tensor))


def with_resident(signature, indices: frozenset[int], unused: frozenset[int] = frozenset()):
    """The signature of the graph before `make_resident`: its resident inputs back in
    their places, as ArgKind.RESIDENT, and its unused ones as ArgKind.UNUSED."""
    from dataclasses import replace

    from tori.frontend.signature import ArgKind

    args = list(signature.args)
    for index in sorted(indices | unused):
        args.insert(index, ArgKind.RESIDENT if index in indices else ArgKind.UNUSED)
    return replace(signature, args=tuple(args))


def make_resident(gm: torch.fx.GraphModule, indices: frozenset[int], unused: frozenset[int] = frozenset()
                  ) -> tuple[torch.fx.GraphModule, ExternalParameters, Prologue | None]:
    """A copy of `gm` in which each input in `indices` is read from a global (the
    FxImporter hooks that declare them), its placeholder removed, and the inputs in
    `unused` (read by nothing) removed. The ops that read only those inputs leave the
    graph for its weight prologue (returned), their results read from globals too."""
    copy = import_copy(gm, deepcopy(gm.graph))
    hooks = ExternalParameters()
    extracted = weight_prologue.extract(copy, indices) if indices else None
    if extracted is not None:
        for number, node in enumerate(extracted[1]):
            _read_from_global(copy, node, derived_name(number), hooks)
        for node in reversed(list(copy.graph.nodes)):  # the prologue's ops, now read by nothing
            if node.op == "call_function" and not node.users and not node.is_impure():
                copy.graph.erase_node(node)
    for index, node in enumerate(copy.graph.find_nodes(op="placeholder")):
        if index in unused:
            copy.graph.erase_node(node)
        if index in indices:
            _read_from_global(copy, node, parameter_name(index), hooks)
    copy.recompile()
    return copy, hooks, extracted[0] if extracted is not None else None


def _read_from_global(gm: torch.fx.GraphModule, node: torch.fx.Node, name: str, hooks: ExternalParameters) -> None:
    """Replace `node` by global `name` of its shape and dtype, one get_attr per use
    (FxImporter binds each once), and remove it."""
    if not node.users:  # a weight only the prologue reads
        gm.graph.erase_node(node)
        return
    first_use = next(n for n in gm.graph.nodes if n.op != "placeholder")
    value = node.meta["val"]
    # Only shape and dtype reach the module: the values come at load time.
    stand_in = torch.empty(value.shape, dtype=value.dtype, device="meta")
    gm.register_buffer(f"_tori_{name}", stand_in)
    hooks.add(stand_in, name)

    def literal(arg: torch.fx.Node) -> torch.fx.Node:
        if arg is not node:
            return arg
        with gm.graph.inserting_before(first_use):
            read = gm.graph.get_attr(f"_tori_{name}")
        read.meta = dict(node.meta)
        return read

    for user in list(node.users):  # a get_attr per use, and per argument of one that names it twice
        user.args = torch.fx.node.map_arg(user.args, literal)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, literal)
    gm.graph.erase_node(node)
