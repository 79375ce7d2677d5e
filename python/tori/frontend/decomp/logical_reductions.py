"""all/any over a dim where IREE's lowering of them fails: a 0-d input, and uint8
(whose result is uint8 in eager). Every other form stays whole: tori-fuse-attention
matches the bool all.dim of the safe softmax, which PyTorch's decomposition hides."""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.all.dim, aten.any.dim)
def all_any_over_a_dim(op, x, dim, keepdim=False):
    """A 0-d input is its own truth value (the one dim, 0 or -1, has one element and
    keepdim has nothing to keep); uint8 reduces its truth values as bool."""
    if x.dim() > 0 and x.dtype != torch.uint8 or x.dim() == 0 and dim not in (0, -1):
        return NotImplemented
    truth = x != 0
    if x.dim() > 0:
        truth = op(truth, dim, keepdim)
    return truth.to(torch.uint8) if x.dtype == torch.uint8 else truth
