"""Indexing ops that IREE does not lower (put, index_reduce, searchsorted, histc,
empty_permuted), written with gathers, comparisons against an arange and reductions:
IREE's scatters give wrong results, so element-to-slot assignment is a one-hot mask
(bounded in size; larger inputs are left undecomposed)."""

from __future__ import annotations

import math

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten

_MASK_LIMIT = 1 << 24  # elements of a one-hot mask


def _static(*sizes) -> bool:
    return all(isinstance(s, int) for s in sizes)


@register_decomposition(aten.put.default)
def put(op, x, index, source, accumulate=False):
    """x.flatten()[index] = source (or += with accumulate); of repeated indices the
    last one wins, as in eager's sequential kernel."""
    n, k = x.numel(), index.numel()
    if not _static(n, k) or n * k > _MASK_LIMIT or (accumulate and x.dtype == torch.bool):
        return NotImplemented
    flat = x.flatten()
    if k == 0:
        return x.clone()
    target = index.flatten()
    target = torch.where(target < 0, target + n, target)
    hits = target.unsqueeze(0) == torch.arange(n, device=x.device).unsqueeze(1)  # (n, k)
    values = source.flatten().to(x.dtype)
    if accumulate:
        added = torch.where(hits, values.unsqueeze(0), torch.zeros((), dtype=x.dtype, device=x.device)).sum(1)
        return (flat + added.to(x.dtype)).view(x.shape)
    last = torch.where(hits, torch.arange(k, device=x.device), -1).amax(1)
    chosen = values.index_select(0, last.clamp_min(0))
    return torch.where(last >= 0, chosen, flat).view(x.shape)


def _reduce_identity(dtype: torch.dtype, reduce: str):
    if reduce == "prod":
        return 1
    if dtype.is_floating_point:
        return -math.inf if reduce == "amax" else math.inf
    info = torch.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


@register_decomposition(aten.index_reduce.default)
def index_reduce(op, x, dim, index, source, reduce, *, include_self=True):
    """Slot index[k] of x along `dim` combined with source's slice k by prod, mean,
    amax or amin (NaN propagates, as in eager); slots no index names keep x's value.
    An integer mean divides with floor rounding, as eager does."""
    if reduce not in ("prod", "mean", "amax", "amin") or x.dtype == torch.bool:
        return NotImplemented
    if x.dim() == 0:  # one slot, as a 1-element vector
        result = index_reduce(op, x.reshape(1), 0, index.reshape(-1), source.reshape(-1), reduce,
                              include_self=include_self)
        return result if result is NotImplemented else result.reshape(())
    dim = dim % x.dim()
    slots, count = x.shape[dim], index.numel()
    if not _static(slots, count, x.numel()) or slots * count * (x.numel() // max(slots, 1)) > _MASK_LIMIT:
        return NotImplemented
    base = x.movedim(dim, 0)
    if count == 0:
        return x.clone()
    rest = (1,) * (base.dim() - 1)
    hits = (index.unsqueeze(0) == torch.arange(slots, device=x.device).unsqueeze(1)).view(slots, count, *rest)
    values = source.movedim(dim, 0).unsqueeze(0).to(x.dtype)  # (1, count, ...)
    named = hits.any(1)  # (slots, 1, ...)
    if reduce == "mean":
        total = torch.where(hits, values, torch.zeros((), dtype=x.dtype, device=x.device)).sum(1).to(x.dtype)
        n = hits.sum(1)
        if include_self:
            total, n = total + base, n + 1
        n = n.to(x.dtype)
        if x.dtype.is_floating_point:
            mean = total / torch.clamp_min(n, 1)
        else:
            mean = torch.div(total, torch.clamp_min(n, 1), rounding_mode="floor")
        result = torch.where(named, mean, base)
    else:
        identity = torch.full((), _reduce_identity(x.dtype, reduce), dtype=x.dtype, device=x.device)
        masked = torch.where(hits, values, identity)
        if reduce == "prod":
            reduced = masked.prod(1).to(x.dtype)
            combined = base * reduced if include_self else reduced
        else:
            reduced = masked.amax(1) if reduce == "amax" else masked.amin(1)
            combined = torch.maximum(base, reduced) if reduce == "amax" else torch.minimum(base, reduced)
            if x.dtype.is_floating_point:  # a NaN in the slot's sources wins
                nan = (torch.isnan(values) & hits).any(1)
                combined = torch.where(nan, torch.full_like(combined, math.nan), combined)
                if not include_self:
                    reduced = torch.where(nan, torch.full_like(reduced, math.nan), reduced)
            if not include_self:
                combined = reduced
        result = torch.where(named, combined, base)
    return result.movedim(0, dim)


@register_decomposition(aten.searchsorted.Tensor)
def searchsorted(op, sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    """ATen's binary search itself, ⌈log2(n + 1)⌉ halving steps on all values at once:
    it matches eager also where NaNs (sorted last) break the order's monotony."""
    n = sorted_sequence.shape[-1]
    if not _static(n, *x.shape) or sorted_sequence.dtype != x.dtype or x.dim() == 0:
        return NotImplemented
    if sorted_sequence.dim() > 1 and sorted_sequence.shape[:-1] != x.shape[:-1]:
        return NotImplemented
    upper = right or side == "right"
    dtype = torch.int32 if out_int32 else torch.int64
    start = torch.zeros(x.shape, dtype=torch.int64, device=x.device)
    end = torch.full(x.shape, n, dtype=torch.int64, device=x.device)
    if n == 0:
        return start.to(dtype)

    def at(positions):
        if sorter is not None:
            positions = _take(sorter, positions)
        return _take(sorted_sequence, positions)

    for _ in range(n.bit_length()):
        active = start < end
        middle = start + torch.div(end - start, 2, rounding_mode="floor")
        value = at(torch.clamp_max(middle, n - 1))
        before = ~(value > x) if upper else ~(value >= x)
        start = torch.where(active & before, middle + 1, start)
        end = torch.where(active & ~before, middle, end)
    return start.to(dtype)


def _take(sequence: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    # sequence[..., positions]: one 1-D sequence for every value, or one per row.
    if sequence.dim() == 1:
        return sequence.index_select(0, positions.flatten()).view(positions.shape)
    return sequence.gather(-1, positions)


@register_decomposition(aten.histc.default)
def histc(op, x, bins=100, min=0, max=0):
    """Counts in `bins` equal bins between min and max (the data's own extremes when
    they are equal, widened by 1 either side when those are equal too); the bin of a
    value is ATen's (x - lo) · bins / (hi - lo), truncated, in the input dtype."""
    if not x.dtype.is_floating_point or not _static(x.numel()) or x.numel() * bins > _MASK_LIMIT:
        return NotImplemented
    values = x.flatten()
    if min == max and x.numel() > 0:
        low, high = values.amin(), values.amax()
    else:
        low = torch.full((), float(min), dtype=x.dtype, device=x.device)
        high = torch.full((), float(max), dtype=x.dtype, device=x.device)
    same = low == high
    low, high = torch.where(same, low - 1, low), torch.where(same, high + 1, high)
    position = ((values - low) * bins / (high - low)).to(torch.int64)
    position = torch.where(position == bins, bins - 1, position)
    inside = (values >= low) & (values <= high)
    hits = (position.unsqueeze(0) == torch.arange(bins, device=x.device).unsqueeze(1)) & inside.unsqueeze(0)
    return hits.sum(1).to(x.dtype)


@register_decomposition(aten.empty_permuted.default)
def empty_permuted(op, size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    """Uninitialized memory laid out in `physical_layout` order: an empty tensor of the
    permuted sizes, viewed back in logical order (as eager's own meta function)."""
    physical = torch.empty([size[i] for i in physical_layout], dtype=dtype, layout=layout, device=device,
                           pin_memory=pin_memory)
    inverse = [0] * len(physical_layout)
    for position, axis in enumerate(physical_layout):
        inverse[axis] = position
    return physical.permute(inverse)


_NARROW_INDICES = (torch.int32, torch.int16, torch.int8, torch.uint8)


@register_decomposition(aten.index_put.default, aten.index.Tensor)
def int64_indices(op, x, indices, *rest):
    """Integer index tensors narrower than int64 (istft's int32 positions) widened:
    Torch-MLIR's index_put builds the full index list with int64 positions for the
    dims without an index, and IREE refused a list of mixed element types."""
    if not any(i is not None and i.dtype in _NARROW_INDICES for i in indices):
        return NotImplemented
    widened = [i.to(torch.int64) if i is not None and i.dtype in _NARROW_INDICES else i for i in indices]
    return op(x, widened, *rest)
