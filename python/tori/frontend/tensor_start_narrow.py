"""A rewrite of the Dynamo graph, before AOTAutograd: `narrow` with its start given as
a 0-d tensor becomes a gather. ATen's composite kernel reads such a start with .item()
and computes the slice's end with symbolic-int builtins (and_, sym_ite) that
Torch-MLIR's FxImporter cannot import; being composite, it runs before tori's
decomposition table is consulted, so the rewrite is made on the Dynamo graph.
"""

from __future__ import annotations

import logging

import torch
import torch.fx

log = logging.getLogger("tori.frontend.tensor_start_narrow")

_NARROW = (torch.narrow, torch.Tensor.narrow)


def narrow_at_tensor_start(x: torch.Tensor, dim: int, start: torch.Tensor, length: int) -> torch.Tensor:
    """Elements start .. start + length - 1 along `dim`, a negative start counted from
    the end as in eager. A start out of range raises as in eager, from Dynamo (it
    guards the start's range); the clamp only keeps every index inside the tensor."""
    dim = dim % x.dim()
    size = x.shape[dim]
    torch._check(0 <= length <= size, lambda: f"narrow: length {length} is out of range for a dim of size {size}")
    start = start.to(torch.int64)
    start = torch.where(start < 0, start + size, start).clamp(0, size - length)
    return x.index_select(dim, torch.arange(length, device=x.device) + start)


def _tensor_start_narrow(node: torch.fx.Node) -> bool:
    is_narrow = (node.op == "call_function" and node.target in _NARROW) or (
        node.op == "call_method" and node.target == "narrow")
    if not is_narrow or len(node.args) != 4 or node.kwargs:
        return False
    start = node.args[2]
    value = start.meta.get("example_value") if isinstance(start, torch.fx.Node) else None
    return (isinstance(value, torch.Tensor) and value.dim() == 0 and not value.dtype.is_floating_point
            and value.dtype != torch.bool and all(isinstance(a, int) for a in (node.args[1], node.args[3])))


def _in_place(node: torch.fx.Node) -> bool:
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return isinstance(name, str) and (name.endswith("_") and not name.endswith("__") or name.startswith("__i"))


def _written_through(node: torch.fx.Node) -> bool:
    """Whether an in-place op may write into `node` or a value computed from it (a
    gather is a copy, where eager's narrow is a view of its input)."""
    seen, pending = {node}, [node]
    while pending:
        for user in pending.pop().users:
            if _in_place(user):
                return True
            if user not in seen:
                seen.add(user)
                pending.append(user)
    return False


def rewrite_tensor_start_narrows(gm: torch.fx.GraphModule) -> None:
    """Call `narrow_at_tensor_start` for each narrow with a tensor start whose result
    nothing writes into."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if not _tensor_start_narrow(node) or _written_through(node):
            continue
        with gm.graph.inserting_before(node):
            gather = gm.graph.call_function(narrow_at_tensor_start, tuple(node.args))
        gather.meta = dict(node.meta)
        node.replace_all_uses_with(gather)
        gm.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        gm.recompile()
        log.debug("rewrote %d narrows with a tensor start", rewritten)
