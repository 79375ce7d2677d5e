"""nonzero of a 0-d tensor, on which iree-compile crashes (SIGSEGV in a greedy
pattern rewrite): that of the one element as a vector, with no columns (eager's
shape: (0 or 1, 0))."""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.nonzero.default)
def nonzero_of_a_scalar(op, x):
    if x.dim() != 0:
        return NotImplemented
    return op(x.reshape(1))[:, :0]
