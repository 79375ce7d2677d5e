"""How a functional ATen graph's Python-level inputs and outputs map onto the
IREE function's arguments and results.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
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


@dataclass(frozen=True)
class GraphSignature:
    args: tuple[ArgKind, ...]
    results: tuple[Result, ...]
    num_iree_results: int


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
