"""prod over a dim of a 0-d tensor, which IREE's lowering of prod.dim_int rejects:
the value itself, in the result dtype."""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.prod.dim_int)
def prod_of_scalar(op, x, dim, keepdim=False, *, dtype=None):
    if x.dim() != 0:
        return NotImplemented
    if dtype is None:
        dtype = torch.int64 if not (x.dtype.is_floating_point or x.dtype.is_complex) else x.dtype
    return x.to(dtype).clone()
