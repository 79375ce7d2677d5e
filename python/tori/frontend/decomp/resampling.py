"""Antialiased bilinear resizing (_upsample_bilinear2d_aa), which IREE does not lower:
ATen's separable triangle filter (widened by the scale when shrinking) as one weight
matrix per axis, rows normalized to sum 1, applied by two matmuls."""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


def _weights(in_size: int, out_size: int, align_corners: bool, scale_factor, device) -> torch.Tensor:
    """(out, in) weights of ATen's _compute_weights_aa for the bilinear filter."""
    if align_corners:
        scale = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    else:
        scale = 1.0 / scale_factor if scale_factor is not None and scale_factor > 0 else in_size / out_size
    support = scale if scale >= 1.0 else 1.0  # interp_size 2, times 0.5, times the scale when shrinking
    inverse_scale = 1.0 / scale if scale >= 1.0 else 1.0
    i = torch.arange(out_size, device=device, dtype=torch.float32).unsqueeze(1)
    center = scale * (i + 0.5)
    first = torch.clamp_min((center - support + 0.5).to(torch.int64), 0)
    end = torch.clamp_max((center + support + 0.5).to(torch.int64), in_size)
    j = torch.arange(in_size, device=device).unsqueeze(0)
    distance = torch.abs((j - center + 0.5) * inverse_scale)
    weight = torch.where((j >= first) & (j < end), torch.clamp_min(1 - distance, 0), 0.0)
    total = weight.sum(1, keepdim=True)
    return torch.where(total != 0, weight / torch.where(total != 0, total, 1.0), weight)


@register_decomposition(aten._upsample_bilinear2d_aa.default)
def upsample_bilinear2d_aa(op, x, output_size, align_corners, scales_h=None, scales_w=None):
    if x.dim() != 4 or not x.dtype.is_floating_point or x.dtype == torch.float64:
        return NotImplemented
    (height, width), (out_h, out_w) = x.shape[-2:], output_size
    if not all(isinstance(s, int) and s > 0 for s in (height, width, out_h, out_w)):
        return NotImplemented
    rows = _weights(height, out_h, align_corners, scales_h, x.device)
    cols = _weights(width, out_w, align_corners, scales_w, x.device)
    values = x.to(torch.float32)
    return (rows @ values @ cols.transpose(0, 1)).to(x.dtype)
