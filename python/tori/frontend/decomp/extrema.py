"""Maxima and minima IREE's torch lowering refuses (its error names a leftover
torch.constant.int or .bool): reductions over a 0-d tensor (amax, amin, argmax,
argmin: on one element they are the element itself, or index 0; argmax and argmin
along a dim of size 1, index 0), and fmax/fmin
(PyTorch's decomposition stops at prims.fmax)."""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


def _dims_of_scalar(dim) -> bool:
    # A 0-d tensor accepts dim 0 or -1 (or a list of them, or none) and reduces nothing.
    dims = [] if dim is None else [dim] if isinstance(dim, int) else list(dim)
    return all(d in (0, -1) for d in dims)


@register_decomposition(aten.amax.default, aten.amin.default)
def scalar_extremum(op, x, dim=(), keepdim=False):
    if x.dim() != 0 or not _dims_of_scalar(dim):
        return NotImplemented
    return x.clone()


@register_decomposition(aten.argmax.default, aten.argmin.default)
def arg_extremum(op, x, dim=None, keepdim=False):
    """On one element, index 0. On floats, the indices of max/min over the dim, whose
    decomposition (selection.py) places NaN as eager does: IREE's argmax skipped NaN,
    a wrong index, silently."""
    if x.dim() == 0 and _dims_of_scalar(dim):
        return torch.zeros((), dtype=torch.int64, device=x.device)
    # One element along the reduced dim (or in all): index 0 everywhere. IREE's form of
    # it, an i1 constant read as int64, failed to compile or read out of bounds.
    if x.numel() > 0 and (x.numel() == 1 if dim is None else x.shape[dim] == 1):
        shape = [1] * x.dim() if dim is None else [1 if d == dim % x.dim() else n for d, n in enumerate(x.shape)]
        zeros = torch.zeros(shape, dtype=torch.int64, device=x.device)
        return zeros if keepdim else zeros.reshape(()) if dim is None else zeros.squeeze(dim)
    if not x.dtype.is_floating_point or x.numel() == 0:
        return NotImplemented
    extremum = torch.max if op is aten.argmax.default else torch.min
    if dim is not None:
        return extremum(x, dim, keepdim).indices
    index = extremum(x.reshape(-1), 0).indices
    return index.reshape([1] * x.dim()) if keepdim else index


@register_decomposition(aten.fmax.default, aten.fmin.default)
def nan_ignoring_max_min(op, a, b):
    """The other operand where one is NaN (NaN where both are), else maximum/minimum."""
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        return NotImplemented
    a, b = a.to(dtype), b.to(dtype)
    chosen = torch.where(a > b if op is aten.fmax.default else a < b, a, b)
    return torch.where(torch.isnan(a), b, torch.where(torch.isnan(b), a, chosen))
