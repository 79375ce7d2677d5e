"""`_softmax` over the last dim of a float32 tensor as its three steps in torch ops:
the row maxima, the exponentials, then the exponentials times the reciprocal of their
sum.

IREE lowers `_softmax` to one dispatch that computes each exponential twice (once for
the sum, once for the result) and accumulates the row maxima and sums in a scalar,
one horizontal reduction per 16 values, wherever the row's length is not a multiple
of the vector width (its split of a reduction into vector accumulators needs one).
DeiT-small's attention scores at 8 images (8x6x197x197, 2 cores): 3.9 ms per call,
against 1.6 in these ops (eager 0.6). Rows shorter than MIN_ROW keep `_softmax`:
three dispatches cost more than they save there; so do rows of a symbolic length.

Graphs traced for a pipeline with tori-fuse-attention keep `_softmax`: that pass
matches it (with PyTorch's attention decomposition) to hand the GPU targets IREE's
fused attention kernel.
"""

from __future__ import annotations

import torch

from tori.config import FUSED_ATTENTION_PASS
from tori.frontend.decompositions import register_decomposition, traced_options

aten = torch.ops.aten

MIN_ROW = 64


def keeps_pytorchs_attention() -> bool:
    """Whether the graph being traced keeps PyTorch's softmax and attention ops: outside
    tori's traces, and for a pipeline with tori-fuse-attention, which matches them."""
    options = traced_options()
    return options is None or FUSED_ATTENTION_PASS in options.tori_pipeline


@register_decomposition(aten._softmax.default)
def softmax_in_three_steps(op, x, dim, half_to_float):
    if half_to_float or x.dtype != torch.float32 or x.dim() == 0 or dim % x.dim() != x.dim() - 1:
        return NotImplemented
    # A symbolic row length keeps `_softmax`: comparing it with MIN_ROW would guard the
    # graph on it (a recompile when rows cross it).
    if not isinstance(x.shape[-1], int) or x.shape[-1] < MIN_ROW or keeps_pytorchs_attention():
        return NotImplemented
    exponentials = torch.exp(x - torch.amax(x, -1, keepdim=True))
    return exponentials * torch.reciprocal(exponentials.sum(-1, keepdim=True))
