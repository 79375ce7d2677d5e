"""Reductions, scans and normalizations of a 0-d tensor, traced on its one-element
1-d view.

A 0-d tensor reduced along its only "dim" (-1 or 0) is the same computation as the
1-element vector reduced along dim 0, and the result reshaped to 0-d. IREE 3.13
does not always get the 0-d form: `_softmax` of a 0-d value made Torch-MLIR's
lowering retry without end ("failed to get softmax result", printed 8 million
times in 90 s), `var` and `std` of one crashed iree-compile (signal 11). Every op
below, given a 0-d first operand, is traced as that op on `x.reshape(1)`, its
results reshaped to 0-d; others go to the entry it replaces.

The ops that select elements and return their indices (max and min along a dim,
sort, topk, kthvalue, median, mode, cummax, cummin) are, along a dim of one
element, that element and index 0: traced so, they never reach IREE's forms of
them, whose index constants on one element failed to compile or read out of bounds
(a min along a dim of size 1 next to a topk of one element). The variance, standard
deviation and their means over no element are NaN (with dynamic shapes, Torch-MLIR's
var of an empty tensor was -0.0). Other empty inputs compile as they are
(tests/test_degenerate_shapes.py checks every op here on each such shape).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.utils._pytree as pytree

aten = torch.ops.aten

# Every op that reduces or scans along dims of its first operand, but amax, amin,
# argmax and argmin: their 0-d forms are the element itself or index 0 (extrema.py).
REDUCING = (
    aten._softmax.default, aten._log_softmax.default, aten._softmax_backward_data.default,
    aten._log_softmax_backward_data.default,
    aten.var.correction, aten.var_mean.correction, aten.std.correction, aten.std_mean.correction,
    aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim, aten.prod.default, aten.prod.dim_int,
    aten.max.dim, aten.min.dim,
    aten.logsumexp.default, aten.linalg_vector_norm.default, aten.all.dim, aten.any.dim,
    aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default, aten.cummax.default, aten.cummin.default,
    aten.sort.default, aten.sort.stable, aten.topk.default, aten.kthvalue.default, aten.median.dim, aten.mode.default,
    aten.nanmedian.dim,
)


# Selections with their indices: whether the values keep the dim ("keep": sort and
# scans) or reduce it, and the `k` that makes them one element of one.
_SELECTING = {
    aten.max.dim: "reduce", aten.min.dim: "reduce", aten.median.dim: "reduce", aten.nanmedian.dim: "reduce",
    aten.mode.default: "reduce", aten.kthvalue.default: "reduce", aten.sort.default: "keep",
    aten.sort.stable: "keep", aten.topk.default: "keep", aten.cummax.default: "keep", aten.cummin.default: "keep",
}


def _bound(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> dict:
    """The op's arguments by name, defaults filled in from its schema."""
    bound = {}
    for position, argument in enumerate(op._schema.arguments):
        if position < len(args):
            bound[argument.name] = args[position]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
    return bound


def _one_element_selection(op, x: torch.Tensor, args: tuple, kwargs: dict):
    """Values and indices of a selection along a dim of one element, or None."""
    bound = _bound(op, (x, *args), kwargs)
    dim = bound.get("dim", -1)
    if x.dim() == 0 or x.shape[dim] != 1 or bound.get("k", 1) != 1:
        return None
    values = x.clone() if _SELECTING[op] == "keep" or bound.get("keepdim", False) else x.squeeze(dim)
    return values, torch.zeros(values.shape, dtype=torch.int64, device=x.device)


_MOMENTS = {aten.var.correction: 1, aten.std.correction: 1, aten.var_mean.correction: 2,
            aten.std_mean.correction: 2}


def _moments_of_nothing(op, x: torch.Tensor, args: tuple, kwargs: dict):
    """var, std and their means over no element: NaN, as eager gives (Torch-MLIR's
    lowering of var over an empty dynamic-shape tensor gave -0.0); None otherwise."""
    bound = _bound(op, (x, *args), kwargs)
    dims = bound.get("dim")
    dims = list(range(x.dim())) if dims is None or len(dims) == 0 else [d % x.dim() for d in dims]
    if not any(isinstance(x.shape[d], int) and x.shape[d] == 0 for d in dims):
        return None
    keepdim = bound.get("keepdim", False)
    shape = [1 if d in dims else n for d, n in enumerate(x.shape) if keepdim or d not in dims]
    nan = torch.full(shape, float("nan"), dtype=x.dtype, device=x.device)
    return nan if _MOMENTS[op] == 1 else (nan, nan.clone())


def on_vector(op: torch._ops.OpOverload, inner: Callable | None) -> Callable:
    """The table entry for `op`: on the 1-element view of a 0-d first operand, a
    selection along a dim of one element as that element, else `inner` (the entry it
    replaces, or none: the op is traced as it is)."""

    def decompose(x, *args, **kwargs):
        if isinstance(x, torch.Tensor) and x.dim() == 0:
            # The softmax backwards take the gradient first and the forward's output second.
            args = tuple(a.reshape(1) if isinstance(a, torch.Tensor) and a.dim() == 0 else a for a in args)
            result = op(x.reshape(1), *args, **kwargs)  # traced again: on a 1-d operand the entry is `inner`
            return pytree.tree_map_only(torch.Tensor, lambda t: t.reshape(()), result)
        if op in _SELECTING and isinstance(x, torch.Tensor):
            selected = _one_element_selection(op, x, args, kwargs)
            if selected is not None:
                return selected
        if op in _MOMENTS and isinstance(x, torch.Tensor) and x.dim() > 0 and x.dtype.is_floating_point:
            moments = _moments_of_nothing(op, x, args, kwargs)
            if moments is not None:
                return moments
        return inner(x, *args, **kwargs) if inner is not None else NotImplemented

    return decompose


def wrap(table: dict) -> dict:
    """`table` with every op above traced on the 1-element view of a 0-d operand."""
    wrapped = dict(table)
    for op in REDUCING:
        wrapped[op] = on_vector(op, table.get(op))
    return wrapped
