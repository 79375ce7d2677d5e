"""BatchNorm in inference as eager's CPU kernel computes it: one scale and one shift per
channel, `x * scale + shift`, with scale = weight / sqrt(var + eps) and shift =
bias - mean * scale.

PyTorch's decomposition traces 17 ops per BatchNorm (the statistics copied, each
operand unsqueezed twice, then a subtraction, two multiplications and an addition over
the whole activation); this one 11, two of them over the activation. The scale and
shift read only weights, so the weight prologue (frontend/weight_prologue.py)
computes them in PyTorch when the weights load. Where the operands' dtypes differ, or
a statistic is not one value per channel, PyTorch's decomposition applies.
"""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten._native_batch_norm_legit_no_training.default)
def batch_norm_inference(op, x, weight, bias, running_mean, running_var, momentum, eps):
    per_channel = [t for t in (weight, bias, running_mean, running_var) if t is not None]
    if not x.dtype.is_floating_point or x.dim() < 2:
        return NotImplemented
    if any(t.dtype != x.dtype or t.dim() != 1 for t in per_channel):
        return NotImplemented
    scale = torch.reciprocal(torch.sqrt(running_var + eps))
    if weight is not None:
        scale = scale * weight
    shift = bias - running_mean * scale if bias is not None else torch.neg(running_mean * scale)
    shape = [x.shape[1]] + [1] * (x.dim() - 2)
    out = x * scale.view(shape) + shift.view(shape)
    # Eager's CPU kernel returns empty statistics in inference.
    return out, x.new_zeros((0,)), x.new_zeros((0,))
