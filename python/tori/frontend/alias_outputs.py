"""Outputs that alias an input or another output, in graphs with dynamic shapes.

AOTAutograd rebuilds such an output from its base after the compiled call: by
replaying its views where their sizes are static, otherwise as
`base.as_strided(out.size(), out.stride(), out.storage_offset())` of the tensor the
compiled graph returned for it. IREE returns a fresh contiguous tensor, so a view
with other strides or an offset (`x.t().reshape(n, 1, -1)` of an `[s0, s1]` input)
came back as the base's first elements in order: wrong values, silently. Here each
such output is replaced by an empty tensor with the sizes, strides and offset of
Dynamo's example value of it (the view as eager makes it; AOTAutograd's functional
graph returns a contiguous copy), evaluated for the call's sizes: only its metadata
is read.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx

# AOTAutograd's output types it regenerates from a base (schemas.OutputType names).
_REGENERATED = {"alias_of_input", "alias_of_intermediate", "alias_of_intermediate_save_as_output",
                "alias_of_intermediate_base_is_user_output"}


def _symbolic(value: torch.Tensor) -> bool:
    return any(not isinstance(n, int) for n in (*value.shape, *value.stride(), value.storage_offset()))


def _bindings(gm: torch.fx.GraphModule) -> list[tuple[object, Callable[[list], int]]]:
    """(symbol, how to read its value from the call's arguments) for each size symbol
    a placeholder carries: a SymInt argument, or a dim of a tensor argument."""
    found = []
    for index, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
            found.append((value.node.expr, lambda args, i=index: int(args[i])))
        elif isinstance(value, torch.Tensor):
            for dim, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    found.append((size.node.expr, lambda args, i=index, d=dim: int(args[i].shape[d])))
    return found


def _evaluate(size, env: dict) -> int:
    return size if isinstance(size, int) else int(size.node.expr.xreplace(env))


def _with_metadata(out: torch.Tensor, size: list[int], stride: list[int], offset: int) -> torch.Tensor:
    extent = offset + (1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0)
    return torch.empty(max(extent, 1), dtype=out.dtype, device=out.device).as_strided(size, stride, offset)


def user_outputs(dynamo_gm: torch.fx.GraphModule) -> list:
    """Dynamo's example value of each output of its graph (None where it has none)."""
    outputs = dynamo_gm.graph.find_nodes(op="output")[0].args[0]
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return [o.meta.get("example_value") if isinstance(o, torch.fx.Node) else None for o in outputs]


def restrider(gm: torch.fx.GraphModule, views: list) -> Callable[[list, Callable], list] | None:
    """A function (args, call) -> call(args)'s outputs, each regenerated output given
    the metadata of its view in `views` (user_outputs); None where the graph has no
    such output with symbolic sizes."""
    context = torch._guards.TracingContext.try_get()
    meta = context.fw_metadata if context is not None else None
    if meta is None:
        return None
    outputs = gm.graph.find_nodes(op="output")[0].args[0]
    offset = meta.num_mutated_inp_runtime_indices
    targets = []
    for i, info in enumerate(meta.output_info):
        if getattr(info.output_type, "name", "") not in _REGENERATED or offset + i >= len(outputs):
            continue
        value = views[i] if i < len(views) else None
        if isinstance(value, torch.Tensor) and _symbolic(value):
            targets.append((offset + i, value))
    if not targets:
        return None
    bindings = _bindings(gm)
    symbols = {s for s, _ in bindings}
    needed = {free for _, v in targets for n in (*v.shape, *v.stride(), v.storage_offset())
              if not isinstance(n, int) for free in n.node.expr.free_symbols}
    if not needed <= symbols:
        return None

    def restride(args: list, call: Callable[[list], list]) -> list:
        env = {symbol: read(args) for symbol, read in bindings}  # before the call, which may clear `args`
        results = list(call(args))
        for index, value in targets:
            results[index] = _with_metadata(results[index], [_evaluate(n, env) for n in value.shape],
                                            [_evaluate(n, env) for n in value.stride()],
                                            _evaluate(value.storage_offset(), env))
        return results

    return restride
