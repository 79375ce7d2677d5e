"""Splicing a replacement into a functional ATen graph: a Python function traced to
ATen ops on the fake values of the graph's nodes (make_fx) and its nodes copied in
before the node it replaces. Shared by the graph rewrites (complex values, seeded
random ops, quantized patterns)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree

from tori.errors import UnsupportedOpError
from tori.stages import Stage

# Node metadata that names the source of an op: copied onto what replaces it, so that
# reports and profiles still point at the user's line.
_SOURCE_KEYS = ("stack_trace", "nn_module_stack", "source_fn_stack")


def value_of(node: Any) -> Any:
    return node.meta.get("val", node.meta.get("example_value")) if isinstance(node, torch.fx.Node) else node


def is_call(node: Any, target) -> bool:
    """Whether `node` is a call of `target` in an FX graph."""
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target


def static_shape(node: Any) -> list[int] | None:
    """The shape of `node`'s tensor value, where every extent is a number."""
    value = value_of(node)
    if not isinstance(value, torch.Tensor) or not all(isinstance(d, int) for d in value.shape):
        return None
    return list(value.shape)


def splice_traced(graph: torch.fx.Graph, node: torch.fx.Node, fn: Callable, sources: list[torch.fx.Node],
                  fake_mode, *, decompose: bool = True, what: str = "") -> Any:
    """fn(*values of `sources`) traced under `fake_mode` (with tori's decompositions
    when `decompose`) and copied into `graph` before `node`; returns fn's result with
    the copied nodes in place of the traced ones. A constant tensor the replacement
    makes (a table computed as it is traced) becomes an attribute of the graph's module;
    a graph without a module refuses it (UnsupportedOpError naming `what`)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tori.frontend.decompositions import decomposition_table

    with fake_mode:
        traced = make_fx(fn, decomposition_table=decomposition_table() if decompose else None,
                         tracing_mode="real")(*(value_of(s) for s in sources))
    env: dict[torch.fx.Node, Any] = {}
    remaining = iter(sources)
    source_meta = {k: node.meta[k] for k in _SOURCE_KEYS if k in node.meta}
    result = None
    with graph.inserting_before(node):
        for sub in traced.graph.nodes:
            if sub.op == "placeholder":
                env[sub] = next(remaining)
            elif sub.op == "output":
                result = pytree.tree_map(lambda n: env[n] if isinstance(n, torch.fx.Node) else n, sub.args[0])
            elif sub.op == "get_attr":
                env[sub] = _constant(graph, getattr(traced, sub.target), what, node)
                env[sub].meta.update(sub.meta)
            else:
                env[sub] = graph.node_copy(sub, lambda n: env[n])
                env[sub].meta.update(source_meta)
    return result


def _constant(graph: torch.fx.Graph, tensor: torch.Tensor, what: str, node: torch.fx.Node) -> torch.fx.Node:
    """A get_attr node of `graph` reading `tensor`, registered on the graph's module."""
    owner = graph.owning_module
    if owner is None:
        raise UnsupportedOpError(f"{what} made a constant tensor", stage=Stage.TORCH.value, op=str(node.target))
    index = 0
    while hasattr(owner, f"_tori_constant_{index}"):
        index += 1
    owner.register_buffer(f"_tori_constant_{index}", tensor)
    return graph.get_attr(f"_tori_constant_{index}")


def add_node(graph: torch.fx.Graph, target, args: tuple, kwargs: dict, like: torch.fx.Node) -> torch.fx.Node:
    """A node computing `target(*args, **kwargs)` at the graph's insertion point, its
    value computed from the arguments' fake values and its source from `like`."""
    node = graph.call_function(target, args, kwargs)
    with fake_mode_of([value_of(a) for a in args if isinstance(a, torch.fx.Node)]):
        node.meta["val"] = target(*(value_of(a) for a in args), **kwargs)
    node.meta.update({k: like.meta[k] for k in _SOURCE_KEYS if k in like.meta})
    return node


def fake_mode_of(values):
    """The fake mode of `values` (a context), or a context that does nothing."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode(values)
    return mode if mode is not None else contextlib.nullcontext()
