"""How a functional ATen graph's Python-level inputs and outputs map onto the
IREE function's arguments and results.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true


class ArgKind(enum.Enum):
    TENSOR = "tensor"
    STATIC_TENSOR = "static tensor"  # a parameter or buffer: the same tensor on every call
    # A parameter or buffer the module holds as a global (frontend/resident.py): not
    # passed; the runtime checks it is unchanged and reloads the module otherwise.
    RESIDENT = "resident"
    UNUSED = "unused"  # an input the graph never reads: not passed (frontend/resident.unused_args)
    WRITTEN_TENSOR = "written tensor"  # a tensor IREE may write into: passed as a copy
    # An input the graph overwrites at some indices (a static KV cache's index_put) and
    # AOTAutograd copies the new value back into: passed in place, so that IREE writes
    # the new rows into it and returns it (`in_place_updates`); no copy of it per call.
    UPDATED_TENSOR = "updated tensor"
    INT = "int"
    FLOAT = "float"
    # A 0-d int64 seed for the graph's random ops (frontend/seeded_random.py), the last
    # argument: the runtime draws it from torch's default generator; callers omit it.
    SEED = "seed"


@dataclass(frozen=True)
class Result:
    """One Python-level output: the IREE result at `index`, or a constant `value`."""

    index: int | None = None
    value: Any = None
    dtype: torch.dtype | None = None  # eager's dtype, for tensor results
    updates: int | None = None  # the UPDATED_TENSOR argument this result is the new value of


@dataclass(frozen=True)
class GraphSignature:
    args: tuple[ArgKind, ...]
    results: tuple[Result, ...]
    num_iree_results: int
    # What the module's derived globals hold, computed from the RESIDENT arguments at
    # each load (frontend/weight_prologue.py); None when it has none.
    prologue: Any = None
    # The checks on arguments the runtime runs before each call (frontend/input_checks.py).
    input_checks: Any = None


def _value(node: Any) -> Any:
    return node.meta.get("val", node.meta.get("example_value")) if isinstance(node, torch.fx.Node) else node


# Ops that IREE lowers to operations updating their destination in place (scatter,
# sort, top-k, scan). When that destination folds to an argument's buffer, IREE
# writes into the caller's tensor (iree-org/iree#16168): such arguments go as copies.
_IN_PLACE_IN_IREE = ("scatter", "index_put", "index_add", "index_copy", "index_fill", "index_reduce", "sort",
                     "topk", "kthvalue", "put", "median", "mode", "unique", "cum")


def _updates_in_place(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    name = getattr(node.target, "__name__", str(node.target))
    return any(part in name for part in _IN_PLACE_IN_IREE)


def _written(placeholder: torch.fx.Node) -> bool:
    """Whether `placeholder`'s buffer may become the destination (first operand) of an
    in-place op: it reaches one through ops whose result has its number of elements (views,
    copies and elementwise ops, which IREE may fold away)."""
    val = _value(placeholder)
    if not isinstance(val, torch.Tensor):
        return False
    size = val.numel()
    seen, stack = set(), [placeholder]
    while stack:
        node = stack.pop()
        for user in node.users:
            if _updates_in_place(user) and user.args and user.args[0] is node:
                return True
            result = _value(user)
            # statically_known_true: comparing symbolic sizes with `==` would add a guard to the
            # shape environment and could pin a dynamic size (a batch of 4 compiled as static 4).
            if user not in seen and isinstance(result, torch.Tensor) and statically_known_true(result.numel() == size):
                seen.add(user)
                stack.append(user)
    return False


def arg_kind(node: torch.fx.Node) -> ArgKind:
    val = _value(node)
    if isinstance(val, torch.Tensor):
        return ArgKind.WRITTEN_TENSOR if _written(node) else ArgKind.TENSOR
    if isinstance(val, (torch.SymFloat, float)):
        return ArgKind.FLOAT
    if isinstance(val, (torch.SymInt, torch.SymBool, int, bool)):
        return ArgKind.INT
    raise TypeError(f"graph input {node.name} has unsupported type {type(val).__name__}")


def in_place_updates(gm: torch.fx.GraphModule) -> dict[int, int]:
    """{output position: input index} for the inputs of `gm` (an AOT graph being
    compiled) that IREE may update in place. AOTAutograd returns the new value of each
    input the user's code mutates as the graph's first outputs and copies it back into
    the input after the call (a copy it skips when the two are the same memory). An
    input qualifies when the graph reads it only to overwrite rows of it,
    `index_put(input, indices, values)` without accumulation: everything else reads
    the new value, so a call that fails after IREE wrote some rows and runs again (the
    eager fallback) computes and writes the same rows. Measured: a static-cache
    decoding step copied every layer's key and value caches twice per token (12.19 ms
    per token with 2048 cached positions, 7.75 in place; 5.20 and 4.99 with 48)."""
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    meta = context.fw_metadata if context is not None else None
    if meta is None or not meta.mutated_inp_runtime_indices:
        return {}
    placeholders = gm.graph.find_nodes(op="placeholder")
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    outputs = list(output) if isinstance(output, (list, tuple)) else [output]
    updates = {}
    for position, index in enumerate(meta.mutated_inp_runtime_indices):
        info = meta.input_info[index]
        if not info.mutates_data or info.mutates_metadata or info.mutates_storage_metadata:
            continue
        if index < len(placeholders) and position < len(outputs) and _overwrites(outputs[position], placeholders[index]):
            updates[position] = index
    return updates


def _overwrites(node: Any, source: torch.fx.Node) -> bool:
    """Whether `node` is an index_put without accumulation into `source`, its only reader."""
    if not isinstance(node, torch.fx.Node) or node.target is not torch.ops.aten.index_put.default:
        return False
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    new, old = _value(node), _value(source)
    return node.args[0] is source and list(source.users) == [node] and not accumulate \
        and isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor) \
        and new.shape == old.shape and new.dtype == old.dtype


def with_updates(signature: GraphSignature, updates: dict[int, int]) -> GraphSignature:
    """`signature` with the inputs of `updates` (in_place_updates) passed in place."""
    usable = {position: index for position, index in updates.items()
              if signature.results[position].index is not None
              and signature.args[index] in (ArgKind.TENSOR, ArgKind.WRITTEN_TENSOR)}
    if not usable:
        return signature
    args = tuple(ArgKind.UPDATED_TENSOR if i in usable.values() else kind for i, kind in enumerate(signature.args))
    results = tuple(replace(result, updates=usable[position]) if position in usable else result
                    for position, result in enumerate(signature.results))
    return replace(signature, args=args, results=results)


def split_outputs(graph: torch.fx.Graph) -> tuple[GraphSignature, list[torch.fx.Node]]:
    """Which outputs IREE computes (tensors and symbolic ints) and which are constants."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    raw = output_node.args[0]
    outputs = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    computed: list[torch.fx.Node] = []
    results = []
    for out in outputs:
        val = _value(out)
        if isinstance(out, torch.fx.Node) and isinstance(val, (torch.Tensor, torch.SymInt, torch.SymFloat)):
            dtype = val.dtype if isinstance(val, torch.Tensor) else None
            results.append(Result(index=len(computed), dtype=dtype))
            computed.append(out)
        else:
            results.append(Result(value=val))
    signature = GraphSignature(
        args=tuple(arg_kind(n) for n in placeholders),
        results=tuple(results),
        num_iree_results=len(computed),
    )
    return signature, computed
