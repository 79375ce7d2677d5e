"""Adaptive max pooling with window sizes that do not divide the input, which IREE
does not lower: every window gathered to one fixed length, then the maximum and the
index that eager's CPU kernel picks."""

from __future__ import annotations

import math

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


def _windows(size: int, out: int, device) -> torch.Tensor:
    """Input positions of each adaptive window (start = ⌊i·size/out⌋, end =
    ⌈(i+1)·size/out⌉), padded to the longest by repeating the window's last position:
    (out, longest). Built with arange: index lists from torch.tensor would put a
    non-functional detach_ into the graph."""
    longest = max(-(-((i + 1) * size) // out) - (i * size) // out for i in range(out))
    i = torch.arange(out, device=device).unsqueeze(1)
    start, end = (i * size) // out, ((i + 1) * size + out - 1) // out
    return torch.minimum(start + torch.arange(longest, device=device), end - 1)


@register_decomposition(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(op, x, output_size):
    """Values and flat (h·W + w) indices. As in eager's kernel, a NaN wins (the last
    one in the window's row-major order), else the first occurrence of the maximum."""
    if x.dim() not in (3, 4) or not x.dtype.is_floating_point:
        return NotImplemented
    (height, width), (out_h, out_w) = x.shape[-2:], output_size
    if not all(isinstance(n, int) for n in (height, width, out_h, out_w)):
        return NotImplemented
    if out_h == 0 or out_w == 0 or height == 0 or width == 0:
        return NotImplemented
    rows, cols = _windows(height, out_h, x.device), _windows(width, out_w, x.device)
    k_h, k_w = rows.shape[1], cols.shape[1]
    gathered = x.index_select(-2, rows.flatten()).index_select(-1, cols.flatten())
    batch = x.shape[:-2]
    window = gathered.reshape(*batch, out_h, k_h, out_w, k_w).transpose(-3, -2).reshape(*batch, out_h, out_w, k_h * k_w)
    flat = (rows[:, None, :, None] * width + cols[None, :, None, :]).reshape(out_h, out_w, k_h * k_w)

    nan = torch.isnan(window)
    has_nan = nan.any(-1)
    filled = window.masked_fill(nan, -math.inf)
    largest = filled.amax(-1)
    position = torch.arange(k_h * k_w, device=x.device)
    first_largest = torch.where(filled == largest.unsqueeze(-1), position, k_h * k_w).amin(-1)
    last_nan = torch.where(nan, position, -1).amax(-1)
    choice = torch.where(has_nan, last_nan, first_largest)
    indices = flat.expand(*batch, out_h, out_w, k_h * k_w).gather(-1, choice.unsqueeze(-1)).squeeze(-1)
    values = torch.where(has_nan, torch.full_like(largest, math.nan), largest)
    return values, indices
