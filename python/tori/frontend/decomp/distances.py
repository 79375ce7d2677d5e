"""p-norm distances that IREE does not lower (cdist, pdist) or lowers with float16
overflow (dist): differences, then the p-norm written out per p, accumulated in
float32 for half precision as eager does."""

from __future__ import annotations

import math

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten



def _p_norm(diff: torch.Tensor, p: float, dim: int) -> torch.Tensor:
    """The p-norm along `dim` of real differences, as eager's distance kernels: p = 0
    counts the nonzero entries, p = inf is the largest magnitude."""
    if p == 0:
        return (diff != 0).sum(dim).to(diff.dtype)
    magnitude = torch.abs(diff)
    if p == math.inf:
        return magnitude.amax(dim)
    if p == 1:
        return magnitude.sum(dim)
    if p == 2:
        return torch.sqrt((diff * diff).sum(dim))
    return torch.pow(torch.pow(magnitude, p).sum(dim), 1.0 / p)


def _applies(*tensors: torch.Tensor) -> bool:
    return all(t.dtype.is_floating_point and t.dtype != torch.float64 for t in tensors)


@register_decomposition(aten.dist.default)
def dist(op, a, b, p=2):
    """‖a - b‖_p over all elements: the difference in the inputs' dtype, the norm
    accumulated in float32 (a float16 sum of squares overflowed to inf)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or not _applies(a, b) or p < 0:
        return NotImplemented
    diff = a - b
    return _p_norm(diff.to(torch.float32).flatten(), float(p), 0).to(diff.dtype)


def _euclidean_by_matmul(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    # ATen's _euclidean_dist, which eager's cdist uses for p = 2 on larger inputs:
    # ‖x‖² - 2 x·y + ‖y‖² as one matmul, clamped at 0; its rounding is part of the result.
    x1_norm = x1.pow(2).sum(-1, keepdim=True)
    x2_norm = x2.pow(2).sum(-1, keepdim=True)
    x1_ = torch.cat([x1.mul(-2), x1_norm, torch.ones_like(x1_norm)], -1)
    x2_ = torch.cat([x2, torch.ones_like(x2_norm), x2_norm], -1)
    return x1_.matmul(x2_.mT).clamp_min(0).sqrt()


@register_decomposition(aten._cdist_forward.default)
def cdist(op, x1, x2, p, compute_mode=None):
    """Distances between the rows of x1 (…, P, M) and x2 (…, R, M), batch dims
    broadcast; for p = 2 the matmul form where eager chooses it (compute_mode 1, or
    the default with more than 25 rows on either side)."""
    if not _applies(x1, x2) or x1.dim() < 2 or x2.dim() < 2 or p < 0:
        return NotImplemented
    dtype = x1.dtype
    mode = 0 if compute_mode is None else compute_mode
    rows1, rows2 = x1.shape[-2], x2.shape[-2]
    x1, x2 = x1.to(torch.float32), x2.to(torch.float32)
    if p == 2 and (mode == 1 or (mode == 0 and (rows1 > 25 or rows2 > 25))):
        batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
        x1 = x1.expand(*batch, *x1.shape[-2:])
        x2 = x2.expand(*batch, *x2.shape[-2:])
        return _euclidean_by_matmul(x1, x2).to(dtype)
    return _p_norm(x1.unsqueeze(-2) - x2.unsqueeze(-3), float(p), -1).to(dtype)


@register_decomposition(aten._pdist_forward.default)
def pdist(op, x, p=2):
    """Distances between the rows of x (N, M) for every pair i < j, in row-major order
    of the pairs, as eager's pdist."""
    if not _applies(x) or x.dim() != 2 or p < 0:
        return NotImplemented
    n = x.shape[0]
    if not isinstance(n, int):
        return NotImplemented
    pairs = n * (n - 1) // 2
    if pairs == 0:
        return x.new_empty((0,))
    # Pair k = (i, j): row i's pairs start at s_i = i(2n - i - 1)/2, and i is the last
    # row whose start is at most k. (Index lists built with torch.tensor would put a
    # non-functional detach_ into the graph.)
    rows = torch.arange(n, device=x.device)
    starts = rows * (2 * n - rows - 1) // 2
    k = torch.arange(pairs, device=x.device)
    first = (starts.unsqueeze(0) <= k.unsqueeze(1)).sum(-1) - 1
    second = k - starts.index_select(0, first) + first + 1
    values = x.to(torch.float32)
    return _p_norm(values.index_select(0, first) - values.index_select(0, second), float(p), -1).to(x.dtype)
