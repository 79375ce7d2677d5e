"""Standard deviation without overflow or underflow of the squares.

Eager's CPU kernel accumulates float32 moments in float64; IREE squares in float32,
so the std of values around 1e20 was inf (eager 9.6e19) and that of values around
1e-25 was 0. Here the values are divided by their largest magnitude (along the
reduced dims) first and the result multiplied by it again. The variance itself is
left as it is: where it overflows float32, eager's overflows too.
"""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


def _scaled_std(x, dim, correction, keepdim):
    scale = torch.amax(torch.abs(x), dim=dim if dim is not None else list(range(x.dim())), keepdim=True)
    scale = torch.where(torch.isfinite(scale) & (scale > 0), scale, torch.ones_like(scale))
    std = torch.sqrt(aten.var.correction(x / scale, dim, correction=correction, keepdim=keepdim))
    return std * (scale if keepdim else scale.reshape(std.shape))


def _applies(x, dim) -> bool:
    return (x.dtype in (torch.float32, torch.float16, torch.bfloat16) and x.numel() > 0 and x.dim() > 0
            and (dim is None or len(dim) > 0))


@register_decomposition(aten.std.correction)
def std(op, x, dim=None, *, correction=None, keepdim=False):
    if not _applies(x, dim):
        return NotImplemented
    return _scaled_std(x, dim, correction, keepdim)


@register_decomposition(aten.std_mean.correction)
def std_mean(op, x, dim=None, *, correction=None, keepdim=False):
    if not _applies(x, dim):
        return NotImplemented
    mean = torch.mean(x, dim=dim if dim is not None else list(range(x.dim())), keepdim=keepdim)
    return _scaled_std(x, dim, correction, keepdim), mean
