"""torch.histogram and torch.histogramdd, which IREE does not lower: each element's bin
found by comparing it with every bin edge (in each dimension), the counts (or weights)
summed per bin from that one-hot table.
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


# histogramdd ---------------------------------------------------------------------------


def _outer_edges(x: torch.Tensor, bins: list[int], range) -> list[torch.Tensor]:
    """Per dimension of the points `x` (..., D): `bins[d]` equal bins over range[2d:2d+2],
    or from the smallest to the largest coordinate, widened as in 1-d."""
    points = x.reshape(-1, x.shape[-1])
    edges = []
    for d, count in enumerate(bins):
        if range is not None:
            left = torch.full((), range[2 * d], dtype=x.dtype, device=x.device)
            right = torch.full((), range[2 * d + 1], dtype=x.dtype, device=x.device)
        elif points.shape[0] == 0:
            left = right = torch.zeros((), dtype=x.dtype, device=x.device)
        else:
            left, right = torch.amin(points[:, d]), torch.amax(points[:, d])
        equal = left == right
        left, right = torch.where(equal, left - 0.5, left), torch.where(equal, right + 0.5, right)
        edges.append(_linspace_edges(left, right, count))
    return edges


def _histogramdd(x: torch.Tensor, edges: list[torch.Tensor], weight: torch.Tensor | None,
                 density: bool) -> torch.Tensor:
    """The counts of the points `x` (..., D) in the cells of the grid `edges` (one
    increasing tensor per dimension), bins as in 1-d: the cell's flat index from each
    coordinate's bin, one one-hot table over all cells."""
    points = x.reshape(-1, x.shape[-1])
    shape = [e.shape[0] - 1 for e in edges]
    cells = 1
    for count in shape:
        cells *= count
    flat = torch.zeros(points.shape[0], 1, dtype=torch.int64, device=x.device)
    inside = torch.ones(points.shape[0], 1, dtype=torch.bool, device=x.device)
    for d, e in enumerate(edges):
        values = points[:, d:d + 1]
        inside = inside & (values >= e[0]) & (values <= e[-1])
        position = torch.clamp((values >= e).sum(dim=1, keepdim=True) - 1, max=shape[d] - 1)
        flat = flat * shape[d] + position
    one_hot = (flat == torch.arange(cells, device=x.device)) & inside
    if weight is None:
        hist = one_hot.to(x.dtype).sum(dim=0)
    else:
        hist = torch.where(one_hot, weight.reshape(-1, 1), torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=0)
    hist = hist.reshape(shape)
    if density:
        hist = hist / hist.sum()
        for d, e in enumerate(edges):
            widths = (e[1:] - e[:-1]).reshape([-1 if i == d else 1 for i in range(len(edges))])
            hist = hist / widths
    return hist


def _dd_applies(x: torch.Tensor, bins) -> bool:
    return _floating(x) and x.dim() >= 1 and len(bins) == x.shape[-1]


@register_decomposition(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(op, x, bins, *, range=None, weight=None, density=False):
    if not _dd_applies(x, bins) or min(bins, default=1) <= 0:
        return NotImplemented
    return _outer_edges(x, bins, range)


@register_decomposition(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_counts(op, x, bins, *, range=None, weight=None, density=False):
    if not _dd_applies(x, bins) or min(bins, default=1) <= 0:
        return NotImplemented
    return _histogramdd(x, _outer_edges(x, bins, range), weight, density)


@register_decomposition(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_edges(op, x, bins, *, weight=None, density=False):
    if not _dd_applies(x, bins) or any(e.dtype != x.dtype or e.dim() != 1 or e.numel() < 2 for e in bins):
        return NotImplemented
    return _histogramdd(x, list(bins), weight, density)
