"""torch.histogram, which IREE does not lower: each element's bin found by comparing it
with every bin edge, the counts (or weights) summed per bin from that one-hot table.
"""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


def _linspace_edges(left: torch.Tensor, right: torch.Tensor, bins: int) -> torch.Tensor:
    """bins + 1 edges from `left` to `right` as ATen's linspace places them: the first
    half counted up from `left`, the second half down from `right`, so both ends are exact."""
    step = (right - left) / bins
    index = torch.arange(bins + 1, device=left.device)
    up = left + index.to(left.dtype) * step
    down = right - (bins - index).to(left.dtype) * step
    return torch.where(index < (bins + 1) // 2, up, down)


def _histogram(x: torch.Tensor, edges: torch.Tensor, weight: torch.Tensor | None,
               density: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The counts of `x` in the bins between consecutive `edges` (increasing): a bin
    holds the values from its left edge up to, not including, its right edge, the last
    bin its right edge too; values outside the edges (and NaN) count nowhere. As eager's
    upper_bound search: the bin is the number of edges at or below the value, less one."""
    values = x.reshape(-1, 1)
    bins = edges.shape[0] - 1
    inside = (values >= edges[0]) & (values <= edges[-1])
    position = torch.clamp((values >= edges).sum(dim=1, keepdim=True) - 1, max=bins - 1)
    one_hot = (position == torch.arange(bins, device=x.device)) & inside
    if weight is None:
        hist = one_hot.to(x.dtype).sum(dim=0)
    else:
        hist = torch.where(one_hot, weight.reshape(-1, 1), torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=0)
    if density:
        hist = hist / hist.sum() / (edges[1:] - edges[:-1])
    return hist, edges


def _floating(x: torch.Tensor) -> bool:
    # Eager's histogram has float32 and float64 kernels only.
    return x.dtype in (torch.float32, torch.float64)


@register_decomposition(aten.histogram.bin_ct)
def histogram_bin_count(op, x, bins=100, *, range=None, weight=None, density=False):
    """`bins` equal bins over `range`, or from the smallest to the largest element (a
    bin of width 1 around them when they are equal, as eager widens it)."""
    if not _floating(x) or bins <= 0:
        return NotImplemented
    if range is not None:
        left = torch.full((), range[0], dtype=x.dtype, device=x.device)
        right = torch.full((), range[1], dtype=x.dtype, device=x.device)
    elif x.numel() == 0:
        left = right = torch.zeros((), dtype=x.dtype, device=x.device)
    else:
        left, right = torch.amin(x), torch.amax(x)
    equal = left == right
    left, right = torch.where(equal, left - 0.5, left), torch.where(equal, right + 0.5, right)
    return _histogram(x, _linspace_edges(left, right, bins), weight, density)


@register_decomposition(aten.histogram.bins_tensor)
def histogram_bin_edges(op, x, bins, *, weight=None, density=False):
    if not _floating(x) or bins.dtype != x.dtype or bins.dim() != 1 or bins.numel() < 2:
        return NotImplemented
    return _histogram(x, bins.clone(), weight, density)
